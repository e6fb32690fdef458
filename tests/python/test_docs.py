"""The README and docs/*.md as a newcomer meets them (issue 42, item 6): every
relative link points at a file that exists (and at a heading there, for an
anchor), and the ```python blocks run.

A block runs in a fresh process in an empty directory. HTML comments right
before its fence say how:
    <!-- no-test: why -->         not run (it uses names the reader supplies)
    <!-- test-setup: NAME -->     SETUPS[NAME] runs first, in the same directory
    <!-- test-needs: tsar.X -->   run only where the package has tsar.X
    <!-- test-needs: module -->   run only where that module is installed
"""
import os
import re
import subprocess
import sys

from tsar_testutil import REPO, child_env

DOCS = [os.path.join(REPO, "README.md")] + sorted(
    os.path.join(REPO, "docs", f) for f in os.listdir(os.path.join(REPO, "docs")) if f.endswith(".md"))

# Blocks that must run, at least (the README's two paths and docs/python.md's
# example), less those skipped for a test-needs this build lacks. A block newly
# marked no-test lowers the count and fails here.
MIN_BLOCKS_RUN = 3

SETUPS = {
    # What docs/python.md's example packs: a torch.save checkpoint.
    "checkpoint": """
import torch
m = torch.nn.Linear(4, 2)
torch.save({"model": m.state_dict(), "epoch": 3}, "checkpoint.pt")
""",
    # The README's transformers path: a tiny LLaMA and its tokenizer as
    # save_pretrained writes them, packed as `tsar pack MODEL_DIR` does.
    "transformers": """
import torch, transformers, tsar
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train_from_iterator(["hello world", "the quick brown fox"] * 5,
                        trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]", "[PAD]"]))
transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                     pad_token="[PAD]").save_pretrained("MODEL_DIR")
torch.manual_seed(0)
transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
).eval().save_pretrained("MODEL_DIR")
tsar.pack("MODEL_DIR", "model.tsar")
""",
}
# docs/programs.md: the same directory, packed with its exported program.
SETUPS["transformers-program"] = SETUPS["transformers"].replace(
    'tsar.pack("MODEL_DIR", "model.tsar")',
    'import tsar.transformers\n'
    'tsar.transformers.pack("MODEL_DIR", "model.tsar", program="exported")')


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def outside_fences(text):
    """The lines of `text` outside ``` fences (links in code are not links)."""
    out, fence = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(line)
    return "\n".join(out)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation but - and _
    dropped, spaces as -."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", outside_fences(read(path)), re.M)}


def links(path):
    """(target, line) of every relative markdown link or image in `path`."""
    text = outside_fences(read(path))
    for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
            yield target, text.count("\n", 0, m.start()) + 1


def broken_links(docs):
    """(what is wrong with each broken relative link of `docs`, links checked)."""
    bad, checked = [], 0
    for doc in docs:
        for target, line in links(doc):
            checked += 1
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(doc), file)) if file else doc
            where = f"{os.path.relpath(doc, REPO)}:{line}: {target}"
            if not os.path.exists(dest):
                bad.append(f"{where}: no {os.path.relpath(dest, REPO)}")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{where}: no heading #{anchor} in {os.path.relpath(dest, REPO)}")
    return bad, checked


def test_every_relative_link_points_at_something_that_exists():
    bad, checked = broken_links(DOCS)
    assert not bad, "\n".join(bad)
    assert checked > 50, checked  # the docs link to each other and into the tree


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading (2)\n")
    (tmp_path / "page.md").write_text(
        "# t\n\n[ok](other.md#a-code-heading-2) [gone](nothing.md) [no](other.md#nope) "
        "[self](#t) [web](https://example.com/x)\n\n```sh\n[not a link](in/code.md)\n```\n")
    bad, checked = broken_links([str(tmp_path / "page.md")])
    assert checked == 4, checked
    assert len(bad) == 2 and bad[0].endswith("nothing.md: no " + os.path.relpath(
        str(tmp_path / "nothing.md"), REPO)) and bad[1].endswith(": no heading #nope in " +
                                                                  os.path.relpath(str(tmp_path / "other.md"), REPO)), bad


def test_the_readme_links_every_docs_page():
    readme = {os.path.normpath(os.path.join(REPO, t.partition("#")[0]))
              for t, _ in links(os.path.join(REPO, "README.md"))}
    index = {os.path.normpath(os.path.join(REPO, "docs", t.partition("#")[0]))
             for t, _ in links(os.path.join(REPO, "docs", "README.md"))}
    for page in DOCS[1:]:
        if os.path.basename(page) != "README.md":
            assert page in readme, f"README.md does not link {os.path.relpath(page, REPO)}"
            assert page in index, f"docs/README.md does not list {os.path.relpath(page, REPO)}"


def python_blocks(path):
    """(line, code, markers) of each ```python block of `path`."""
    lines = read(path).split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            markers = {}
            k = start - 1
            while k >= 0 and lines[k].startswith("<!--"):
                m = re.match(r"<!-- ([\w-]+):?\s*(.*?)\s*-->", lines[k])
                if m:
                    markers[m.group(1)] = m.group(2)
                k -= 1
            yield start + 1, "\n".join(lines[start + 1:j]), markers
            i = j
        i += 1


def blocks():
    return [(os.path.relpath(doc, REPO), line, code, markers)
            for doc in DOCS for line, code, markers in python_blocks(doc)]


def has(name):
    """Whether this build has tsar.X, or (a module name without "tsar.")
    that module is installed (torchao, beside the oldest torch it is not)."""
    import importlib.util

    import tsar

    if not name.startswith("tsar."):
        return importlib.util.find_spec(name) is not None
    obj = tsar
    for part in name.split(".")[1:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_the_python_blocks_run(tmp_path):
    ran, skipped, failed, lacking = [], [], [], 0
    for n, (doc, line, code, markers) in enumerate(blocks()):
        where = f"{doc}:{line}"
        if "no-test" in markers:
            skipped.append(f"{where} ({markers['no-test']})")
            continue
        needs = markers.get("test-needs")
        if needs and not has(needs):
            skipped.append(f"{where} (no {needs} in this build)")
            lacking += 1
            continue
        setup = markers.get("test-setup")
        assert setup is None or setup in SETUPS, f"{where}: no set-up {setup!r} in test_docs.py"
        work = tmp_path / f"block{n}"
        work.mkdir()
        script = (SETUPS[setup] if setup else "") + "\n" + code + "\n"
        r = subprocess.run([sys.executable, "-c", script], cwd=work, env=child_env(),
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            failed.append(f"{where}: exit {r.returncode}\n{r.stderr[-3000:]}")
        else:
            ran.append(where)
    assert not failed, "\n\n".join(failed)
    assert len(ran) >= MIN_BLOCKS_RUN - lacking, f"ran {ran}, skipped {skipped}"


def test_the_block_markers_are_read():
    """A marker names what it must, so a typo cannot silently skip a block."""
    for doc, line, _, markers in blocks():
        for key in markers:
            assert key in ("no-test", "test-setup", "test-needs"), f"{doc}:{line}: marker {key!r}"
        if "no-test" in markers:
            assert markers["no-test"], f"{doc}:{line}: say why the block is not run"
