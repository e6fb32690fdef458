"""vLLM loads a tsar archive through tsar.vllm (issue 59, item 1): greedy
tokens of a tiny LLaMA from the archive equal those from its save_pretrained
directory, and a damaged or foreign archive is refused before any weight is
loaded. Skipped where vLLM cannot be imported (this repository's .venv has
none; docs/python.md "vLLM" says how the CPU build installs).

vLLM runs its own torch, so tsar runs its portable path here. Each vLLM
engine runs in a child process (this file run as a script), which vLLM
itself splits into an engine core and a worker: tsar's loader reaches them
through the ``vllm.general_plugins`` entry point. Where tsar is not installed
as a distribution (the build tree), the test puts a dist-info directory that
declares that entry point on the children's PYTHONPATH, as ``pip install
tsar`` would.

Also a script: ``python tests/python/test_vllm.py KIND MODEL_DIR ARCHIVE``
prints the greedy tokens as JSON (KIND: dir, tsar-dir; tsar, model="model.tsar",
needs vLLM to skip its speculators probe of `model`, see docs/python.md).
"""
import json
import os
import subprocess
import sys
import time

PROMPTS = ["hello world", "the quick brown fox", "hello there fox jumps"]
MAX_TOKENS = 12


def _engine_kwargs(kind, model_dir, archive):
    common = dict(enforce_eager=True, max_model_len=64, max_num_seqs=4, seed=0, dtype="float32")
    if kind == "dir":
        return dict(model=model_dir, **common)
    if kind == "tsar":
        return dict(model=archive, load_format="tsar", config_format="tsar",
                    tokenizer_mode="tsar", **common)
    if kind == "tsar-dir":
        return dict(model=model_dir, load_format="tsar",
                    model_loader_extra_config={"archive": archive}, **common)
    raise ValueError(kind)


def _child(kind, model_dir, archive):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(**_engine_kwargs(kind, model_dir, archive))
    seconds = time.perf_counter() - start
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True))
    print("RESULT " + json.dumps({"kind": kind, "llm_seconds": round(seconds, 2),
                                  "tokens": [list(o.outputs[0].token_ids) for o in outs],
                                  "prompt_tokens": [list(o.prompt_token_ids) for o in outs]}),
          flush=True)


if __name__ == "__main__":
    _child(*sys.argv[1:4])
    sys.exit(0)


import pytest  # noqa: E402

try:
    import vllm  # noqa: F401
    _NO_VLLM = ""
except Exception as e:  # ImportError, or a vLLM that cannot start beside this torch
    _NO_VLLM = f"needs vLLM (import vllm: {type(e).__name__}: {e})"

pytestmark = pytest.mark.skipif(bool(_NO_VLLM), reason=_NO_VLLM or "vLLM present")

import torch  # noqa: E402

import tsar  # noqa: E402
import tsar_testutil  # noqa: E402


def _entry_point_dir(root):
    """A directory to put on PYTHONPATH that declares tsar's vllm.general_plugins
    entry point, where tsar is not installed as a distribution."""
    from importlib.metadata import entry_points

    if any(ep.value == "tsar.vllm:register" for ep in entry_points(group="vllm.general_plugins")):
        return None
    d = os.path.join(root, "entry-point")
    info = os.path.join(d, "tsar_vllm_test_plugin-0.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: tsar-vllm-test-plugin\nVersion: 0.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\ntsar = tsar.vllm:register\n")
    return d


def _save_tiny_llama(directory):
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=100, special_tokens=["[UNK]", "[PAD]", "<s>", "</s>"])
    tok.train_from_iterator(["hello world", "the quick brown fox jumps", "hello there fox"] * 5,
                            trainer)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>",
        eos_token="</s>").save_pretrained(directory)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=128,
        bos_token_id=2, eos_token_id=3, pad_token_id=1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.eval().save_pretrained(directory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("vllm"))
    model_dir = os.path.join(root, "dir")
    _save_tiny_llama(model_dir)
    archive = os.path.join(root, "model.tsar")
    tsar.pack(model_dir, archive)
    env = tsar_testutil.child_env()
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env["HF_HUB_OFFLINE"] = "1"
    extra = _entry_point_dir(root)
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([extra, env["PYTHONPATH"]])
    return root, model_dir, archive, env


def _run(env, kind, model_dir, archive, timeout=600):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), kind, model_dir, archive],
                       capture_output=True, text=True, timeout=timeout, env=env)
    result = None
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return r, result


def test_tokens_equal_safetensors(tiny):
    root, model_dir, archive, env = tiny
    results = {}
    # model="model.tsar" (kind "tsar") does not start in vLLM 0.32.0: its
    # EngineArgs reads config.json from `model` (maybe_override_with_speculators)
    # before any config_format is consulted. docs/python.md "vLLM".
    for kind in ("dir", "tsar-dir"):
        r, result = _run(env, kind, model_dir, archive)
        assert r.returncode == 0 and result is not None, (kind, r.stdout[-3000:],
                                                          r.stderr[-6000:])
        results[kind] = result
    want = results["dir"]
    assert all(len(t) == MAX_TOKENS for t in want["tokens"])
    for kind in ("tsar-dir",):
        assert results[kind]["prompt_tokens"] == want["prompt_tokens"], kind
        assert results[kind]["tokens"] == want["tokens"], kind


def _damaged_copy(archive, root):
    """The archive with one bit of one tensor's data flipped (found by its
    bytes); the tensors whose storage that damages (as "entry/name")."""
    with tsar.open(archive) as a:
        name = next(n for n in a.keys() if n.endswith("down_proj.weight"))
        needle = a[name].contiguous().view(torch.uint8).numpy().tobytes()[:64]
    with open(archive, "rb") as f:
        data = bytearray(f.read())
    offset = data.find(needle)
    assert offset > 0 and data.find(needle, offset + 1) < 0
    data[offset + 8] ^= 1
    bad = os.path.join(root, "damaged.tsar")
    with open(bad, "wb") as f:
        f.write(bytes(data))
    with tsar.open(bad) as a:
        damaged = a.damaged()
    assert damaged == [f"model/{name}"], damaged
    return bad, damaged


def test_damaged_archive_refused_before_loading(tiny):
    root, model_dir, archive, env = tiny
    bad, damaged = _damaged_copy(archive, root)
    r, result = _run(env, "tsar-dir", model_dir, bad)
    assert r.returncode != 0 and result is None
    log = r.stdout + r.stderr  # vLLM logs to stdout
    assert damaged[0] in log, log[-4000:]
    assert "tsar: checking" not in log


def test_other_model_refused_before_loading(tiny):
    """An archive of another model (another hidden size) beside the directory vLLM reads."""
    root, model_dir, archive, env = tiny
    import transformers

    other_dir = os.path.join(root, "other")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=1, num_key_value_heads=1)).save_pretrained(other_dir)
    other = os.path.join(root, "other.tsar")
    tsar.pack(other_dir, other)
    r, result = _run(env, "tsar-dir", model_dir, other)
    assert r.returncode != 0 and result is None
    log = r.stdout + r.stderr
    assert "hidden_size: expected 64, found 32" in log, log[-4000:]


def test_not_a_model_refused(tiny):
    """An archive with no config.json attached (tsar.save of plain tensors)."""
    root, model_dir, archive, env = tiny
    plain = os.path.join(root, "plain.tsar")
    tsar.save({"w": torch.zeros(4)}, plain)
    r, result = _run(env, "tsar-dir", model_dir, plain)
    assert r.returncode != 0 and result is None
    log = r.stdout + r.stderr
    assert "config.json: expected an attached file" in log, log[-4000:]
