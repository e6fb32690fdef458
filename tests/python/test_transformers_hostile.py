"""Archives nobody here wrote, against tsar.transformers (issue 56, items 1,
5, 8 and 12): an archive is data, never code (no import, no prompt, no
pickle); readers look up only the attached files they need; load_model
loads what from_pretrained loads, with its rules for what to ignore; bad
content raises tsar.Error naming the archive and the file, nothing else.
Every input is made at test time."""
import json
import os
import subprocess
import sys
import tracemalloc

import pytest
import torch

import tsar
from tsar_testutil import child_env, in_mapping, load_bert_bit_exact, mapped_ranges

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
safetensors_torch = pytest.importorskip("safetensors.torch")
import tsar.transformers as tt  # noqa: E402
from test_transformers_one_call import TEXTS, bert, gpt2, llama, save_model  # noqa: E402

IDS = torch.tensor([[1, 17, 200, 42, 7, 250, 3]])


def dir_files(directory):
    """{relative name: bytes} of every file under ``directory`` but the weights."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory).replace(os.sep, "/")
            if not rel.endswith(".safetensors") and not rel.endswith(".index.json"):
                with open(path, "rb") as f:
                    out[rel] = f.read()
    return out


def save_archive(path, files, tensors=None, metadata=None):
    """An archive of ``tensors`` (default: one small tensor) with ``files``
    attached as spec §4.7.1 attaches them (bytes under "file:" + name)."""
    meta = {"file:" + name: data for name, data in files.items()}
    meta.update(metadata or {})
    tsar.save(tensors if tensors is not None else {"w": torch.zeros(2)}, str(path), metadata=meta)
    return str(path)


def json_bytes(value):
    return json.dumps(value).encode()


def deep(n=100_000):
    return b"[" * n + b"]" * n


def model_dir(tmp_path, model=None, name="m"):
    return save_model(str(tmp_path / name), model if model is not None else llama(True))


# -- item 1: an archive never runs code -----------------------------------------

EVIL = """import pathlib
pathlib.Path({marker!r}).write_text("the archive's code ran")
from transformers import PretrainedConfig, PreTrainedTokenizerFast
class EvilConfig(PretrainedConfig):
    model_type = "evilmodel"
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""

LOAD_IN_A_CHILD = """import json, sys, warnings
import tsar.transformers as tt
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tok = tt.load_tokenizer(sys.argv[1])
print(json.dumps({"notes": [str(w.message) for w in caught],
                  "ids": [tok(t)["input_ids"] for t in sys.argv[2:]]}))
"""


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_an_auto_map_never_runs_the_archives_code(tmp_path, where):
    """config.json of an unknown model_type with auto_map.AutoConfig, or a
    tokenizer_config.json with auto_map.AutoTokenizer, beside an attached
    evil.py, with "y" waiting on stdin: transformers would ask "Do you wish to
    run the custom code?" and import evil.py. load_tokenizer neither asks nor
    imports, notes the auto_map it ignored, and encodes as the plain tokenizer."""
    d = model_dir(tmp_path)
    files = dir_files(d)
    marker = tmp_path / "ran"
    files["evil.py"] = EVIL.format(marker=str(marker)).encode()
    config = json.loads(files["config.json"])
    config["model_type"] = "evilmodel"
    tok_cfg = json.loads(files["tokenizer_config.json"])
    if where == "config.json":
        config["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
    else:
        tok_cfg.pop("tokenizer_class", None)
        tok_cfg["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    files["config.json"], files["tokenizer_config.json"] = json_bytes(config), json_bytes(tok_cfg)
    archive = save_archive(tmp_path / "evil.tsar", files)

    env = child_env()
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", LOAD_IN_A_CHILD, archive, *TEXTS], input="y\n",
                       capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert not marker.exists(), "the archive's evil.py was imported"
    assert "Do you wish to run the custom code" not in r.stdout + r.stderr
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert any("auto_map" in n and where in n and archive in n for n in out["notes"]), out["notes"]
    want = transformers.AutoTokenizer.from_pretrained(d)
    assert out["ids"] == [want(t)["input_ids"] for t in TEXTS]


def test_a_tokenizer_class_that_is_a_model_is_refused_and_no_pickle_is_loaded(
        tmp_path, monkeypatch):
    """tokenizer_class "AutoModelForCausalLM" beside an attached pickled
    pytorch_model.bin: AutoTokenizer would return a model made by torch.load
    of the archive's pickle. load_tokenizer refuses the class (UNSUPPORTED,
    naming it and the file) and never unpickles anything."""
    d = model_dir(tmp_path)
    files = dir_files(d)
    tok_cfg = json.loads(files["tokenizer_config.json"])
    tok_cfg["tokenizer_class"] = "AutoModelForCausalLM"
    files["tokenizer_config.json"] = json_bytes(tok_cfg)
    pickled = tmp_path / "pytorch_model.bin"
    torch.save(transformers.AutoModelForCausalLM.from_pretrained(d).state_dict(), pickled)
    files["pytorch_model.bin"] = pickled.read_bytes()
    archive = save_archive(tmp_path / "model-as-tokenizer.tsar", files)

    unpickled = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: unpickled.append(a) or real_load(*a, **k))
    with pytest.raises(tsar.Error) as e:
        tt.load_tokenizer(archive)
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED
    text = str(e.value)
    assert archive in text and "tokenizer_config.json" in text and "AutoModelForCausalLM" in text
    assert unpickled == []
    # In config.json too.
    files["tokenizer_config.json"] = json_bytes({k: v for k, v in tok_cfg.items()
                                                 if k != "tokenizer_class"})
    config = json.loads(files["config.json"])
    config["tokenizer_class"] = "LlamaForCausalLM"
    files["config.json"] = json_bytes(config)
    archive = save_archive(tmp_path / "model-as-tokenizer-2.tsar", files)
    with pytest.raises(tsar.Error) as e:
        tt.load_tokenizer(archive)
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED
    assert "config.json" in str(e.value) and "LlamaForCausalLM" in str(e.value)
    assert unpickled == []


def test_only_the_files_the_tokenizer_reads_are_written(tmp_path, monkeypatch):
    """Among attached code, pickles, weights and a model card, load_tokenizer
    writes only the tokenizer's files (and config.json) for
    AutoTokenizer.from_pretrained, and the tokenizer encodes, decodes and
    renders chat templates as AutoTokenizer.from_pretrained(MODEL_DIR)."""
    d = model_dir(tmp_path)
    os.makedirs(os.path.join(d, "additional_chat_templates"))
    with open(os.path.join(d, "additional_chat_templates", "tool.jinja"), "w") as f:
        f.write("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    files = dir_files(d)
    files.update({"evil.py": b"raise SystemExit('imported')", "modeling_evil.py": b"x = 1",
                  "pytorch_model.bin": b"\x80\x04N.", "training_args.bin": b"\x80\x04N.",
                  "README.md": b"# card", "additional_chat_templates/x.py": b"x = 1"})
    archive = save_archive(tmp_path / "m.tsar", files)

    seen = []
    real = transformers.AutoTokenizer.from_pretrained.__func__

    def spy(cls, directory, *args, **kwargs):
        for root, _, names in os.walk(directory):
            seen.extend(os.path.relpath(os.path.join(root, n), directory) for n in names)
        seen.append(("trust_remote_code", kwargs.get("trust_remote_code")))
        return real(cls, directory, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(spy))
    tok = tt.load_tokenizer(archive)
    monkeypatch.undo()
    names = {n for n in seen if isinstance(n, str)}
    assert ("trust_remote_code", False) in seen
    assert not {n for n in names if n.endswith((".py", ".bin", ".md"))}, names
    assert {"tokenizer.json", "tokenizer_config.json", "config.json",
            os.path.join("additional_chat_templates", "tool.jinja")} <= names
    assert names <= {"tokenizer.json", "tokenizer_config.json", "config.json",
                     "chat_template.jinja", "special_tokens_map.json", "added_tokens.json",
                     os.path.join("additional_chat_templates", "tool.jinja")}, names

    want = transformers.AutoTokenizer.from_pretrained(d)
    assert type(tok) is type(want)
    for text in TEXTS:
        assert tok(text)["input_ids"] == want(text)["input_ids"], text
        assert tok.decode(want(text)["input_ids"]) == want.decode(want(text)["input_ids"])
    chat = [{"role": "user", "content": "hello"}]
    for name in (None, "tool"):
        assert tok.apply_chat_template(chat, chat_template=name, tokenize=False) == \
            want.apply_chat_template(chat, chat_template=name, tokenize=False)
    assert tok.all_special_tokens == want.all_special_tokens
    with pytest.raises(tsar.Error) as e:
        tt.load_tokenizer(archive, trust_remote_code=True)
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT and "never runs code" in str(e.value)


# -- item 5: look up only what is needed ---------------------------------------

def test_archive_file_looks_up_one_name(tmp_path):
    """Archive.file(name): the bytes or None by one lookup; file_names() the
    sorted names; files() a read-only mapping, equal to the dict it was,
    readable after close."""
    path = save_archive(tmp_path / "f.tsar", {"b.txt": b"B", "a/x.json": b"{}"},
                        metadata={"lr": 0.5, "note": b"bytes, not a file"})
    a = tsar.open(path)
    assert a.file("b.txt") == b"B" and a.file("a/x.json") == b"{}"
    for absent in ("missing", "note", "lr", "../b.txt", "./b.txt", "", "a", None, 3):
        assert a.file(absent) is None, absent
    assert a.file_names() == ["a/x.json", "b.txt"]
    files = a.files()
    assert files == {"a/x.json": b"{}", "b.txt": b"B"} and list(files) == ["a/x.json", "b.txt"]
    assert "b.txt" in files and "note" not in files and len(files) == 2
    assert files.get("missing") is None
    assert dict(files.items()) == {"a/x.json": b"{}", "b.txt": b"B"}
    with pytest.raises(KeyError):
        files["note"]
    with pytest.raises(TypeError):
        files["b.txt"] = b"C"  # read-only
    a.close()
    assert files["b.txt"] == b"B"


def peak_bytes(fn):
    """The peak of memory Python allocated while ``fn`` ran (tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_readers_do_not_copy_attached_files_they_do_not_need(tmp_path):
    """Four 16 MiB attached files beside a model: load_config, load_model and
    load_tokenizer read config.json (and what they need), not those 64 MiB."""
    d = model_dir(tmp_path, bert())
    files = dir_files(d)
    tensors = safetensors_torch.load_file(os.path.join(d, "model.safetensors"))
    small = save_archive(tmp_path / "small.tsar", files, tensors)
    big = {f"data/big{i}.txt": bytes([65 + i]) * (16 << 20) for i in range(4)}
    archive = save_archive(tmp_path / "big.tsar", {**files, **big}, tensors)
    del big
    for fn in (tt.load_config, tt.load_model, tt.load_tokenizer):  # imports and caches first
        fn(small)
    # Measured: 0.01, 0.14 and 0.04 MiB; 64 MiB each when every file was copied.
    assert peak_bytes(lambda: tt.load_config(archive)) < 1 << 20
    assert peak_bytes(lambda: tt.load_model(archive)) < 4 << 20
    assert peak_bytes(lambda: tt.load_tokenizer(archive)) < 4 << 20
    a = tsar.open(archive)
    assert peak_bytes(lambda: a.file("config.json")) < 1 << 20
    assert peak_bytes(lambda: a.files()["config.json"]) < 1 << 20
    assert peak_bytes(lambda: "config.json" in a.files()) < 1 << 20
    assert a.file("data/big3.txt") == b"D" * (16 << 20)


# -- item 8: what from_pretrained loads, load_model loads ----------------------

def add_tensors(directory, extra):
    """``extra`` tensors added into the directory's model.safetensors."""
    path = os.path.join(directory, "model.safetensors")
    tensors = safetensors_torch.load_file(path)
    tensors.update(extra)
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})


def test_a_stored_non_persistent_buffer_is_left_as_from_pretrained_leaves_it(tmp_path):
    """BERT checkpoints of older transformers hold embeddings.position_ids,
    which BERT keeps non-persistent today (the published all-MiniLM-L6-v2
    does): load_model loads it as from_pretrained does, outputs bit-exact."""
    d = model_dir(tmp_path, bert())
    positions = torch.arange(32).expand((1, -1)).contiguous()
    add_tensors(d, {"embeddings.position_ids": positions})
    archive = str(tmp_path / "bert.tsar")
    tsar.pack(d, archive)
    assert "embeddings.position_ids" in tsar.open(archive).keys()
    model, reference = load_bert_bit_exact(archive, d, IDS.clamp(max=255))
    assert torch.equal(model.embeddings.position_ids, reference.embeddings.position_ids)
    ranges = mapped_ranges(archive)
    for name, p in model.named_parameters():
        assert not p.is_meta and in_mapping(p.data_ptr(), ranges), name
    # Beside it, a tensor of another shape is still a mismatch, said as such.
    add_tensors(d, {"pooler.dense.bias": torch.zeros(5)})
    tsar.pack(d, archive)
    with pytest.raises(tsar.Error) as e:
        tt.load_model(archive)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "pooler.dense.bias: shape [32] vs archive [5]" in str(e.value)
    assert "left out as from_pretrained leaves them: embeddings.position_ids" in str(e.value)


def test_keys_the_class_ignores_are_ignored_and_others_are_not(tmp_path):
    """GPT-2's _keys_to_ignore_on_load_unexpected ("attn.bias": the causal
    masks older checkpoints hold) are not a mismatch; a stored tensor nothing
    ignores still is, named."""
    d = model_dir(tmp_path, gpt2())
    mask = torch.tril(torch.ones(32, 32, dtype=torch.bool)).view(1, 1, 32, 32)
    add_tensors(d, {"transformer.h.0.attn.bias": mask, "transformer.h.1.attn.bias": mask.clone()})
    archive = str(tmp_path / "gpt2.tsar")
    tsar.pack(d, archive)
    reference = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    model = tt.load_model(archive)
    ids = IDS.clamp(max=255)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)

    add_tensors(d, {"transformer.extra.weight": torch.ones(3)})
    foreign = str(tmp_path / "foreign.tsar")
    tsar.pack(d, foreign)
    with pytest.raises(tsar.Error) as e:
        tt.load_model(foreign)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "not in module: transformer.extra.weight" in str(e.value)
    assert tt.load_model(foreign, strict=False).lm_head.weight.shape == (256, 32)


class BertIgnoringItsPoolerBias(transformers.BertModel):
    """A class that, as LED's final_logits_bias, lets checkpoints lack a tensor."""
    _keys_to_ignore_on_load_missing = [r"pooler\.dense\.bias"]


def test_a_tensor_the_class_lets_checkpoints_lack_is_initialized(tmp_path):
    """_keys_to_ignore_on_load_missing: the archive lacks pooler.dense.bias;
    load_model makes it as from_pretrained does (initialized by the class),
    the rest bound and bit-exact."""
    d = model_dir(tmp_path, bert())
    path = os.path.join(d, "model.safetensors")
    tensors = safetensors_torch.load_file(path)
    del tensors["pooler.dense.bias"]
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    archive = str(tmp_path / "bert.tsar")
    tsar.pack(d, archive)
    reference = BertIgnoringItsPoolerBias.from_pretrained(d).eval()
    model = tt.load_model(archive, model_class=BertIgnoringItsPoolerBias)
    bias = model.pooler.dense.bias
    assert not bias.is_meta and bias.shape == (32,) and torch.equal(bias, torch.zeros(32))
    ids = IDS.clamp(max=255)
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, reference(ids).last_hidden_state)
    with pytest.raises(tsar.Error) as e:  # the plain class lacks nothing
        tt.load_model(archive)
    assert "pooler.dense.bias" in str(e.value)


def test_the_base_model_of_a_model_with_a_head(tmp_path):
    """model_class=AutoModel of a LlamaForCausalLM archive: the base model,
    bound under base_model_prefix ("model."), as from_pretrained loads it."""
    d = model_dir(tmp_path, llama(False))
    archive = str(tmp_path / "llama.tsar")
    tsar.pack(d, archive)
    reference = transformers.AutoModel.from_pretrained(d).eval()
    model = tt.load_model(archive, model_class=transformers.AutoModel)
    assert type(model) is transformers.LlamaModel
    with torch.no_grad():
        assert torch.equal(model(IDS).last_hidden_state, reference(IDS).last_hidden_state)
    ranges = mapped_ranges(archive)
    assert in_mapping(model.embed_tokens.weight.data_ptr(), ranges)


# -- item 12: only tsar.Error for bad content ----------------------------------

def _llama_config(d, **changes):
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    config.update(changes)
    return json_bytes(config)


# name: (what to change in the attached files, the loaders that must refuse, the
# file they must name); the other loaders may succeed
BAD = {
    "deep config.json": (lambda d: {"config.json": deep()},
                         ("load_config", "load_model", "load_tokenizer"), "file config.json"),
    "config.json a list": (lambda d: {"config.json": b"[1, 2]"},
                           ("load_config", "load_model", "load_tokenizer"), "file config.json"),
    "model_type a list": (lambda d: {"config.json": _llama_config(d, model_type=["llama"])},
                          ("load_config", "load_model", "load_tokenizer"), "file config.json"),
    "architectures a dict": (lambda d: {"config.json": _llama_config(d, architectures={"a": 1})},
                             ("load_model",), "file config.json"),
    "dtype load": (lambda d: {"config.json": _llama_config(d, dtype="load")},
                   ("load_config", "load_model", "load_tokenizer"), "file config.json"),
    "dtype a number": (lambda d: {"config.json": _llama_config(d, dtype=5)},
                       ("load_config", "load_model", "load_tokenizer"), "file config.json"),
    "deep generation_config.json": (lambda d: {"generation_config.json": deep()},
                                    ("load_model",), "file generation_config.json"),
    "deep tokenizer.json": (lambda d: {"tokenizer.json": deep()}, ("load_tokenizer",),
                            "file tokenizer.json"),
    "deep tokenizer_config.json": (lambda d: {"tokenizer_config.json": deep()},
                                   ("load_tokenizer",), "file tokenizer_config.json"),
    "tokenizer_class a list": (lambda d: {"tokenizer_config.json": json_bytes(
        {"tokenizer_class": ["TokenizersBackend"]})}, ("load_tokenizer",),
        "file tokenizer_config.json"),
    "a very long template name": (lambda d: {
        "additional_chat_templates/" + "t" * 300 + ".jinja": b"{{ 1 }}"},
        ("load_tokenizer",), "additional_chat_templates/ttt"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_content_raises_tsar_error_naming_the_file(tmp_path, case):
    change, refusing, culprit = BAD[case]
    d = model_dir(tmp_path)
    files = dir_files(d)
    files.update(change(d))
    tensors = safetensors_torch.load_file(os.path.join(d, "model.safetensors"))
    archive = save_archive(tmp_path / "bad.tsar", files, tensors)
    for name in ("load_config", "load_model", "load_tokenizer"):
        try:
            getattr(tt, name)(archive)
        except tsar.Error as e:
            assert e.code in (tsar.ErrorCode.BAD_INPUT, tsar.ErrorCode.UNSUPPORTED), (name, e)
            assert archive in str(e) and culprit in str(e), (name, str(e))
            assert len(str(e)) < 2000, (name, len(str(e)))  # not a dump of the content
        else:
            assert name not in refusing, f"{name} accepted {case}"


def test_attached_names_that_cannot_both_be_files_do_not_stop_the_tokenizer(tmp_path):
    """Attached names "a" and "a/b", and "additional_chat_templates" beside
    "additional_chat_templates/t.jinja": not all can be files of one
    directory. They are not tokenizer files but the template, which
    load_tokenizer writes, and the tokenizer loads with it."""
    d = model_dir(tmp_path)
    files = dir_files(d)
    files.update({"a": b"1", "a/b": b"2", "additional_chat_templates": b"3",
                  "additional_chat_templates/t.jinja": b"{{ messages[0]['content'] }}!",
                  "x" * 400: b"4"})
    archive = save_archive(tmp_path / "names.tsar", files)
    tok = tt.load_tokenizer(archive)
    chat = [{"role": "user", "content": "hello"}]
    assert tok.apply_chat_template(chat, chat_template="t", tokenize=False) == "hello!"
    want = transformers.AutoTokenizer.from_pretrained(d)
    assert tok("hello world")["input_ids"] == want("hello world")["input_ids"]
