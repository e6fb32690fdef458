"""vLLM loads a tsar archive through tsar.vllm (issue 59): greedy tokens of a
tiny LLaMA from a plain archive and from a runtime-layout archive
(``tsar-vllm pack``) equal those from its save_pretrained directory; a damaged,
foreign or differently stamped archive is refused before any weight is
loaded; and two replicas of a ~256 MiB model bound from one runtime-layout
archive hold one copy of the weights between them (summed Pss). Skipped where
vLLM cannot be imported (this repository's .venv has none;
scripts/test-vllm.sh runs this file in a pinned vLLM CPU venv with tsar's
wheel installed beside it; docs/vllm.md).

vLLM runs its own torch, so tsar runs its portable path here. Each vLLM
engine runs in a child process (this file run as a script), which vLLM
itself splits into an engine core and a worker: tsar's loader reaches them
through the ``vllm.general_plugins`` entry point. Where tsar is not installed
as a distribution (the build tree), the test puts a dist-info directory that
declares that entry point on the children's PYTHONPATH, as ``pip install
tsar`` would.

Also a script: ``python tests/python/test_vllm.py KIND MODEL_DIR ARCHIVE [hold]``
prints the greedy tokens as JSON (KIND: dir, tsar-dir, tsar-dir-repack,
tsar-dir-any-version, archive; KIND@tp2 for 2 tensor-parallel ranks; tsar, model="model.tsar", needs vLLM to skip its
speculators probe of `model`, see docs/vllm.md); with ``hold`` it then keeps
the engine until its stdin closes.
"""
import json
import os
import subprocess
import sys
import time

PROMPTS = ["hello world", "the quick brown fox", "hello there fox jumps"]
MAX_TOKENS = 12


def _engine_kwargs(kind, model_dir, archive):
    kind, _, tp = kind.partition("@tp")  # "tsar-dir@tp2": tensor-parallel size 2
    common = dict(enforce_eager=True, max_model_len=64, max_num_seqs=4, seed=0, dtype="float32",
                  tensor_parallel_size=int(tp or 1))
    if kind == "dir":
        return dict(model=model_dir, **common)
    if kind == "tsar":
        return dict(model=archive, load_format="tsar", config_format="tsar",
                    tokenizer_mode="tsar", **common)
    if kind == "archive":  # the archive alone: tsar.vllm.engine_args
        import tsar.vllm

        return tsar.vllm.engine_args(archive, **common)
    extra = {"tsar-dir": {}, "tsar-dir-repack": {"repack": True},
             "tsar-dir-any-version": {"version_match": "any"}}
    if kind in extra:
        return dict(model=model_dir, load_format="tsar",
                    model_loader_extra_config={"archive": archive, **extra[kind]}, **common)
    raise ValueError(kind)


def _child(kind, model_dir, archive, hold=""):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(**_engine_kwargs(kind, model_dir, archive))
    seconds = time.perf_counter() - start
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True))
    print("RESULT " + json.dumps({"kind": kind, "llm_seconds": round(seconds, 2),
                                  "tokens": [list(o.outputs[0].token_ids) for o in outs],
                                  "texts": [o.outputs[0].text for o in outs],
                                  "prompt_tokens": [list(o.prompt_token_ids) for o in outs]}),
          flush=True)
    if hold == "hold":  # the engine stays up (its memory measurable) until stdin closes
        sys.stdin.read()


if __name__ == "__main__":
    _child(*sys.argv[1:5])
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

sys.path.insert(0, os.path.join(tsar_testutil.REPO, "bench"))
from peers.vllm_serving import plugin_dir, stop_engines, tree_pss_kib  # noqa: E402


def _entry_point_dir(root):
    """A directory to put on PYTHONPATH that declares tsar's vllm.general_plugins
    entry point, where tsar is not installed as a distribution."""
    from importlib.metadata import entry_points

    if any(ep.value == "tsar.vllm:register" for ep in entry_points(group="vllm.general_plugins")):
        return None
    return plugin_dir(os.path.join(root, "entry-point"), "tsar-vllm-test-plugin", "tsar",
                      "tsar.vllm:register")


def _save_llama(directory, **sizes):
    """A LLaMA with random weights and a tiny BPE tokenizer (vocabulary 100)
    in ``directory``, as save_pretrained writes it; ``sizes`` override the
    tiny model's config (hidden 64, 2 layers, vocabulary 128, float32)."""
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
    config = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=128,
                  bos_token_id=2, eos_token_id=3, pad_token_id=1)
    config.update(sizes)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    scale = 0.2 if config["hidden_size"] <= 64 else 0.02
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * scale)
    model.eval().save_pretrained(directory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("vllm"))
    model_dir = os.path.join(root, "dir")
    _save_llama(model_dir)
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


def _run_ok(env, kind, model_dir, archive):
    r, result = _run(env, kind, model_dir, archive)
    assert r.returncode == 0 and result is not None, (kind, r.stdout[-3000:], r.stderr[-6000:])
    return r.stdout + r.stderr, result  # vLLM logs to stdout


@pytest.fixture(scope="module")
def reference(tiny):
    """vLLM's own greedy tokens of the tiny model, from its directory."""
    root, model_dir, archive, env = tiny
    _, want = _run_ok(env, "dir", model_dir, archive)
    assert all(len(t) == MAX_TOKENS for t in want["tokens"])
    return want


def test_tokens_equal_safetensors(tiny, reference):
    root, model_dir, archive, env = tiny
    # model="model.tsar" (kind "tsar") does not start in vLLM 0.32.0: its
    # EngineArgs reads config.json from `model` (maybe_override_with_speculators)
    # before any config_format is consulted. docs/vllm.md.
    log, result = _run_ok(env, "tsar-dir", model_dir, archive)
    assert result["prompt_tokens"] == reference["prompt_tokens"]
    assert result["tokens"] == reference["tokens"]
    assert "tsar: checking" in log


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


def _checked_by_loader(model_dir, archive):
    """What the loader does before any weight is loaded (open, verify, match
    the config), called as vLLM's worker calls it, without starting vLLM:
    its config of ``model_dir`` as vLLM reads it."""
    import transformers
    from vllm.config.load import LoadConfig

    import tsar.vllm

    hf = transformers.AutoConfig.from_pretrained(model_dir)
    model_config = type("ModelConfig", (), {"model": model_dir, "hf_config": hf,
                                            "hf_text_config": hf, "quantization": None})()
    loader = tsar.vllm.TsarModelLoader(LoadConfig(
        load_format="tsar", model_loader_extra_config={"archive": archive}))
    loader.download_model(model_config)


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
    _checked_by_loader(model_dir, archive)  # its own archive passes
    with pytest.raises(tsar.Error, match="hidden_size: expected 64, found 32") as e:
        _checked_by_loader(model_dir, other)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH and other in str(e.value)


def test_not_a_model_refused(tiny):
    """An archive with no config.json attached (tsar.save of plain tensors),
    and a file that is not an archive."""
    root, model_dir, archive, env = tiny
    plain = os.path.join(root, "plain.tsar")
    tsar.save({"w": torch.zeros(4)}, plain)
    with pytest.raises(tsar.Error, match="config.json: expected an attached file"):
        _checked_by_loader(model_dir, plain)
    with pytest.raises(tsar.Error) as e:
        _checked_by_loader(model_dir, os.path.join(model_dir, "config.json"))
    assert e.value.code == tsar.ErrorCode.BAD_MAGIC, e.value


# Runtime-layout archives (issue 59, item 2): tsar-vllm pack, bound in place.

def _pack_runtime(env, model_dir, out, *args):
    """tsar-vllm pack MODEL_DIR -o OUT: the console script beside this Python
    where tsar is installed (the wheel), else the module."""
    script = os.path.join(os.path.dirname(sys.executable), "tsar-vllm")
    cmd = [script] if os.path.exists(script) else [sys.executable, "-m", "tsar._vllm_cli"]
    r = subprocess.run(cmd + ["pack", model_dir, "-o", out, "--dtype", "float32", *args],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
    assert f"tsar-vllm: wrote {out}: 1 entries" in r.stderr, r.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def runtime(tiny):
    root, model_dir, archive, env = tiny
    return _pack_runtime(env, model_dir, os.path.join(root, "model.vllm.tsar"))


def _stamp(path):
    from tsar import _vllm_runtime

    with tsar.open(path) as a:
        return _vllm_runtime.read_stamp(a)


def test_runtime_archive_holds_vllms_own_layout(runtime, tiny):
    root, model_dir, archive, env = tiny
    with tsar.open(runtime) as a:
        assert a.entries == ["rank0"]
        names = set(a.keys("rank0"))
        files = set(a.file_names())
        fused = a["model.layers.0.self_attn.qkv_proj.weight"]
    # vLLM's fused qkv (64 + 64 + 64 rows: one head of 64 each) and gate/up.
    assert tuple(fused.shape) == (192, 64)
    assert "model.layers.1.mlp.gate_up_proj.weight" in names
    assert not any(".q_proj." in n for n in names)
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= files
    with tsar.open(archive) as plain:
        q = plain["model.layers.0.self_attn.q_proj.weight"]
        v = plain["model.layers.0.self_attn.v_proj.weight"]
    assert torch.equal(fused[:64], q) and torch.equal(fused[128:], v)
    stamp = _stamp(runtime)
    assert stamp == {"format": "tsar-vllm-runtime/1", "vllm_version": vllm.__version__,
                     "architectures": ["LlamaForCausalLM"], "dtype": "float32",
                     "quantization": None, "tensor_parallel_size": 1,
                     "torch_version": torch.__version__.split("+")[0]}


def test_runtime_layout_tokens_equal(tiny, reference, runtime):
    """Bound in place, vLLM's repack skipped (the default) and kept
    (repack=True): the directory's greedy tokens both ways."""
    root, model_dir, archive, env = tiny
    log, result = _run_ok(env, "tsar-dir", model_dir, runtime)
    assert result["tokens"] == reference["tokens"]
    assert "entry rank0" in log and "layers kept unpacked, shared" in log, log[-3000:]
    assert "tsar: checking" not in log  # bound, not fed to load_weights
    log, result = _run_ok(env, "tsar-dir-repack", model_dir, runtime)
    assert result["tokens"] == reference["tokens"]
    assert "repacked by vLLM: a private copy" in log, log[-3000:]


def _restamped(runtime, path, **changes):
    """The runtime archive again with its stamp changed (roles and bytes kept)."""
    from tsar import _vllm_runtime

    with tsar.open(runtime) as a:
        metadata = {k: v for k, v in a.metadata().items()}
        stamp = json.loads(metadata[_vllm_runtime.STAMP_KEY])
        stamp.update(changes)
        metadata[_vllm_runtime.STAMP_KEY] = json.dumps(stamp)
        tsar.save({"rank0": a.state_dict("rank0")}, path, metadata=metadata)
    return path


def test_runtime_other_vllm_version_refused(tiny, reference, runtime):
    """A stamp of another vLLM version: refused by default, before the model
    is built, naming both versions; version_match="any" binds it."""
    root, model_dir, archive, env = tiny
    other = _restamped(runtime, os.path.join(root, "other-version.tsar"), vllm_version="0.1.0")
    r, result = _run(env, "tsar-dir", model_dir, other)
    log = r.stdout + r.stderr
    assert r.returncode != 0 and result is None
    assert "vllm_version: archive '0.1.0', this vLLM" in log, log[-4000:]
    assert "model built in" not in log
    log, result = _run_ok(env, "tsar-dir-any-version", model_dir, other)
    assert result["tokens"] == reference["tokens"]


class _Config:
    """What stamp_of reads of a VllmConfig."""

    def __init__(self, architectures=("LlamaForCausalLM",), dtype=torch.float32,
                 quantization=None, tp=1):
        hf = type("HF", (), {"architectures": list(architectures)})()
        self.model_config = type("MC", (), {"hf_config": hf, "dtype": dtype,
                                            "quantization": quantization})()
        self.parallel_config = type("PC", (), {"tensor_parallel_size": tp})()


def test_stamp_check_names_every_difference():
    from tsar import _vllm_runtime

    stamp = _vllm_runtime.stamp_of(_Config())
    _vllm_runtime.check_stamp("a.tsar", stamp, _Config())  # its own set-up: binds
    with pytest.raises(tsar.Error) as e:
        _vllm_runtime.check_stamp("a.tsar", stamp, _Config(
            architectures=["MistralForCausalLM"], dtype=torch.bfloat16, quantization="fp8", tp=2))
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    for diff in ("architectures: archive ['LlamaForCausalLM'], this vLLM ['MistralForCausalLM']",
                 "dtype: archive 'float32', this vLLM 'bfloat16'",
                 "quantization: archive None, this vLLM 'fp8'",
                 "tensor_parallel_size: archive 1, this vLLM 2"):
        assert diff in str(e.value), str(e.value)
    assert "vllm_version" not in str(e.value)
    major, minor = vllm.__version__.split(".")[:2]
    same_release = dict(stamp, vllm_version=f"{major}.{minor}.999")
    with pytest.raises(tsar.Error, match="vllm_version: archive '"):
        _vllm_runtime.check_stamp("a.tsar", same_release, _Config())
    _vllm_runtime.check_stamp("a.tsar", same_release, _Config(), "release")
    other_release = dict(stamp, vllm_version=f"{major}.{int(minor) + 1}.0")
    with pytest.raises(tsar.Error, match="compared release"):
        _vllm_runtime.check_stamp("a.tsar", other_release, _Config(), "release")
    _vllm_runtime.check_stamp("a.tsar", other_release, _Config(), "any")
    with pytest.raises(ValueError, match="version_match"):
        _vllm_runtime.check_stamp("a.tsar", stamp, _Config(), "newer")


@pytest.mark.parametrize("value, why", [
    ("not json", "expected JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"format": "tsar-vllm-runtime/2"}', "expected a JSON object"),
    (b"bytes", "expected a string"),
])
def test_bad_stamp_refused(tmp_path, value, why):
    from tsar import _vllm_runtime

    path = str(tmp_path / "bad.tsar")
    tsar.save({"w": torch.zeros(2)}, path, metadata={_vllm_runtime.STAMP_KEY: value})
    with tsar.open(path) as a, pytest.raises(tsar.Error, match=why) as e:
        _vllm_runtime.read_stamp(a)
    assert e.value.code == tsar.ErrorCode.BAD_INPUT and path in str(e.value)


def _start_replicas(env, kind, model_dir, archive, count):
    """``count`` engines (this file run as a script, ``hold``), started
    together; returns them once each has printed its tokens."""
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), kind, model_dir,
                               archive, "hold"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, start_new_session=True) for _ in range(count)]
    results, logs = [], []
    for p in procs:
        lines = []
        for line in p.stdout:  # vLLM's log, then the RESULT line
            lines.append(line)
            if line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT "):]))
                break
        logs.append("".join(lines))
    return procs, results, logs


@pytest.fixture(scope="module")
def medium(tiny):
    """A ~256 MiB LLaMA (float32; hidden 1024, 4 layers of 64 MiB, the tiny
    tokenizer's vocabulary) and its runtime-layout archive."""
    root, _, _, env = tiny
    model_dir = os.path.join(root, "medium")
    _save_llama(model_dir, hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=8)
    runtime = _pack_runtime(env, model_dir, os.path.join(root, "medium.vllm.tsar"))
    return model_dir, runtime


def test_replicas_share_one_copy(tiny, medium):
    """Two replicas bound from one runtime-layout archive, each in its own
    processes: the same greedy tokens as vLLM loading the directory, and
    summed Pss <= 1.1 x one copy of the weights + 2 x one replica's private
    state (one `auto` replica's Pss minus the weights)."""
    root, _, _, env = tiny
    model_dir, runtime = medium
    with tsar.open(runtime) as a:
        weights_kib = sum(t.numel() * t.element_size()
                          for t in a.state_dict("rank0").values()) >> 10
    assert weights_kib > 240 << 10
    procs, results, logs = _start_replicas(env, "dir", model_dir, runtime, 1)
    try:
        assert len(results) == 1, logs[0][-6000:]
        auto_kib = tree_pss_kib(procs[0].pid)
    finally:
        stop_engines(procs)
    want = results[0]["tokens"]
    private_kib = auto_kib - weights_kib
    assert private_kib > 0, (auto_kib, weights_kib)
    procs, results, logs = _start_replicas(env, "tsar-dir", model_dir, runtime, 2)
    try:
        assert len(results) == 2, [log[-6000:] for log in logs]
        summed_kib = sum(tree_pss_kib(p.pid) for p in procs)
    finally:
        stop_engines(procs)
    for result, log in zip(results, logs):
        assert result["tokens"] == want
        assert "layers kept unpacked, shared" in log, log[-3000:]
    bound_kib = 1.1 * weights_kib + 2 * private_kib
    print(f"weights {weights_kib >> 10} MiB; one auto replica {auto_kib >> 10} MiB Pss; "
          f"two tsar replicas {summed_kib >> 10} MiB summed Pss (bound {int(bound_kib) >> 10} "
          f"MiB; two auto replicas would be about {2 * auto_kib >> 10} MiB)")
    assert summed_kib <= bound_kib, (summed_kib, bound_kib, auto_kib, weights_kib)


# The archive alone (tsar.vllm.engine_args, tsar-vllm serve): vLLM is given a
# directory of the archive's config and tokenizer files.

def test_model_dir_holds_the_archives_config_and_tokenizer(tiny, tmp_path, monkeypatch):
    from tsar import _vllm_cli

    root, model_dir, archive, env = tiny
    monkeypatch.setenv("TSAR_VLLM_CACHE", str(tmp_path / "cache"))
    d = _vllm_cli.model_dir(archive)
    assert os.path.dirname(d) == str(tmp_path / "cache")
    want = sorted(n for n in os.listdir(model_dir) if not n.endswith(".safetensors"))
    assert sorted(os.listdir(d)) == want
    for name in want:
        with open(os.path.join(d, name), "rb") as f, open(os.path.join(model_dir, name), "rb") as g:
            assert f.read() == g.read(), name
    assert _vllm_cli.model_dir(archive) == d  # made once
    assert sorted(os.listdir(tmp_path / "cache")) == [os.path.basename(d)]


def test_model_dir_writes_no_code(tiny, tmp_path):
    """An archive someone else packed: its auto_map is dropped (noted) and a
    .py attached to it is never written."""
    from tsar import _vllm_cli

    root, model_dir, archive, env = tiny
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
    tok = {"tokenizer_class": "PreTrainedTokenizerFast",
           "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}
    hostile = str(tmp_path / "hostile.tsar")
    tsar.save({"w": torch.zeros(2)}, hostile, metadata={
        "file:config.json": json.dumps(cfg).encode(),
        "file:tokenizer_config.json": json.dumps(tok).encode(),
        "file:evil.py": b"raise SystemExit('ran')\n"})
    with pytest.warns(UserWarning, match="auto_map"):
        d = _vllm_cli.model_dir(hostile, str(tmp_path / "served"))
    assert sorted(os.listdir(d)) == ["config.json", "tokenizer_config.json"]
    for name in ("config.json", "tokenizer_config.json"):
        with open(os.path.join(d, name)) as f:
            assert "auto_map" not in json.load(f)
    plain = str(tmp_path / "plain.tsar")
    tsar.save({"w": torch.zeros(2)}, plain)
    with pytest.raises(tsar.Error, match="config.json: expected an attached file"):
        _vllm_cli.model_dir(plain)


def test_serve_argv(tiny, tmp_path, monkeypatch):
    from tsar import _vllm_cli

    root, model_dir, archive, env = tiny
    monkeypatch.setenv("TSAR_VLLM_CACHE", str(tmp_path / "cache"))
    argv = _vllm_cli.serve_argv(archive, ["--port", "8001", "--model-loader-extra-config",
                                          '{"verify": false}'])
    d = _vllm_cli.model_dir(archive)
    assert argv == ["serve", d, "--load-format", "tsar", "--model-loader-extra-config",
                    json.dumps({"verify": False, "archive": os.path.abspath(archive)}),
                    "--served-model-name", "model", "--port", "8001"]
    named = _vllm_cli.serve_argv(archive, ["--served-model-name", "llama"])
    assert named.count("--served-model-name") == 1 and named[-1] == "llama"
    joined = _vllm_cli.serve_argv(archive, ['--model-loader-extra-config={"verify": false}'])
    assert joined[:6] == argv[:6] and len(joined) == 8
    with pytest.raises(tsar.Error, match="--trust-remote-code") as e:
        _vllm_cli.serve_argv(archive, ["--trust-remote-code"])
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT and archive in str(e.value)
    for bad in (["--model-loader-extra-config", "{verify"],
                ["--model-loader-extra-config=[1]"]):
        with pytest.raises(tsar.Error, match="--model-loader-extra-config: expected a JSON "
                                             "object, found") as e:
            _vllm_cli.serve_argv(archive, bad)
        assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT and archive in str(e.value)


def test_the_archive_alone(tiny, reference, runtime):
    """LLM(**tsar.vllm.engine_args("model.vllm.tsar")): no model directory
    needed beside the archive; vLLM's tokens, bound in place."""
    root, model_dir, archive, env = tiny
    env = dict(env, TSAR_VLLM_CACHE=os.path.join(root, "vllm-cache"))
    log, result = _run_ok(env, "archive", model_dir, runtime)
    assert result["prompt_tokens"] == reference["prompt_tokens"]
    assert result["tokens"] == reference["tokens"]
    assert "layers kept unpacked, shared" in log, log[-3000:]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tsar_vllm_serve(tiny, reference, runtime):
    """tsar-vllm serve ARCHIVE: vLLM's OpenAI server on the archive alone
    answers a completion with the text vLLM gives from the directory."""
    import signal
    import urllib.request

    root, model_dir, archive, env = tiny
    env = dict(env, TSAR_VLLM_CACHE=os.path.join(root, "vllm-cache"))
    port = _free_port()
    script = os.path.join(os.path.dirname(sys.executable), "tsar-vllm")
    cmd = [script] if os.path.exists(script) else [sys.executable, "-m", "tsar._vllm_cli"]
    log = open(os.path.join(root, "serve.log"), "w+")
    p = subprocess.Popen(cmd + ["serve", runtime, "--dtype", "float32", "--port", str(port),
                                "--host", "127.0.0.1", "--max-model-len", "64",
                                "--enforce-eager", "--seed", "0"],
                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        body = json.dumps({"model": "model.vllm", "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS,
                           "temperature": 0, "ignore_eos": True}).encode()
        deadline = time.time() + 600
        answer = None
        while answer is None and time.time() < deadline and p.poll() is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                                 {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=60) as r:
                    answer = json.loads(r.read())
            except OSError:
                time.sleep(2)
        log.seek(0)
        text = log.read()
        assert answer is not None, text[-6000:]
    finally:
        os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
    assert answer["choices"][0]["text"] == reference["texts"][0]
    assert answer["model"] == "model.vllm"
    assert "layers kept unpacked, shared" in text, text[-3000:]


def test_tensor_parallel_ranks_bind_their_own_entries(tiny):
    """tsar-vllm pack -tp 2: one entry per rank, each only that rank's slice
    (vLLM's fused qkv of 2 heads of 64: 3 x 64 rows a rank); two ranks bind
    them and give vLLM's tokens from the directory on 2 ranks."""
    root, _, _, env = tiny
    model_dir = os.path.join(root, "two-heads")
    _save_llama(model_dir, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                num_key_value_heads=2)
    runtime = os.path.join(root, "tp2.vllm.tsar")
    script = os.path.join(os.path.dirname(sys.executable), "tsar-vllm")
    cmd = [script] if os.path.exists(script) else [sys.executable, "-m", "tsar._vllm_cli"]
    r = subprocess.run(cmd + ["pack", model_dir, "-o", runtime, "--dtype", "float32",
                              "--tensor-parallel-size", "2"],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
    with tsar.open(runtime) as a:
        assert a.entries == ["rank0", "rank1"]
        shapes = {e: tuple(a.tensor("model.layers.0.self_attn.qkv_proj.weight", e).shape)
                  for e in a.entries}
        gate_up = a.tensor("model.layers.0.mlp.gate_up_proj.weight", "rank1").shape
    assert shapes == {"rank0": (192, 128), "rank1": (192, 128)}
    assert tuple(gate_up) == (256, 128)  # 2 x 256 / 2
    assert _stamp(runtime)["tensor_parallel_size"] == 2
    _, want = _run_ok(env, "dir@tp2", model_dir, runtime)
    log, result = _run_ok(env, "tsar-dir@tp2", model_dir, runtime)
    assert result["tokens"] == want["tokens"]
    assert "entry rank0" in log and "entry rank1" in log, log[-3000:]
