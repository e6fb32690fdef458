"""The wiring of issue 28's peer adapters (bench/peers): on a tiny model of each
kind (ResNet, LLaMA-style with tied embeddings, mixture of experts), every peer
loads, from the file format it is built for, the same tensors as the reference
state_dict, bit for bit (dtype, shape, strides, bytes), into a module whose
parameters and buffers are where the adapter says (inside the file's mapping
for the mapping peers), with tied weights one Parameter, and the forward gives
the reference output exactly. So no benchmark row measures a loader that
loaded something else. A peer whose package is missing, or that needs a GPU,
is skipped with its reason."""
import os
import sys

import pytest
import torch

from tsar_testutil import REPO, same_tensor

sys.path.insert(0, os.path.join(REPO, "bench"))
from peers import adapters, models  # noqa: E402
from peers import p9_warm  # noqa: E402


@pytest.fixture(scope="module", params=models.KINDS)
def model(request, tmp_path_factory):
    pytest.importorskip({"a": "torchvision", "b": "transformers", "c": "torch"}[request.param])
    spec = models.spec(request.param, "tiny")
    reference = spec.reference()
    source = adapters.Source(spec, reference, str(tmp_path_factory.mktemp(f"peers_{spec.kind}")))
    x = spec.example_input()
    return spec, source, x, spec.forward(reference, x)


def runnable(adapter, spec):
    reason = adapter.unavailable() or adapter.applies(spec)
    if reason:
        pytest.skip(f"{adapter.name}: {reason}")


@pytest.mark.parametrize("adapter", adapters.ADAPTERS, ids=lambda a: a.name)
def test_peer_loads_the_reference_tensors_bit_exactly(model, adapter):
    spec, source, x, want = model
    runnable(adapter, spec)
    path = adapter.prepare(source)
    module = adapter.load(path, spec.make)

    got = module.state_dict()
    assert sorted(got) == sorted(source.state_dict)
    for name, ref in source.state_dict.items():
        t = got[name]
        assert not t.is_meta, f"{adapter.name}: {name} is still on meta"
        assert same_tensor(t.cpu(), ref) == "", f"{adapter.name}: {name}: {same_tensor(t.cpu(), ref)}"

    # Parameters stay Parameters, buffers buffers; tied weights one Parameter
    # object again (the LLaMA's lm_head and embedding).
    assert {n for n, _ in module.named_parameters()} == {n for n, _ in source.module.named_parameters()}
    assert {n for n, _ in module.named_buffers()} == {n for n, _ in source.module.named_buffers()}
    assert all(isinstance(p, torch.nn.Parameter) for p in module.parameters())
    assert adapters.tie_groups(module) == adapters.tie_groups(source.module)
    if spec.kind == "b":
        assert module.lm_head.weight is module.model.embed_tokens.weight

    # Where the bytes are is what the adapter declares: the file's pages, or
    # memory of the peer's own (so a timing means what the report says).
    inside = adapters.tensors_in_files(module, adapters.files_of(path))
    if adapter.maps_file:
        assert all(inside.values()), [n for n, ok in inside.items() if not ok]
    else:
        assert not any(ok for n, ok in inside.items() if got[n].numel()), "a copying peer mapped the file"

    if adapter.needs_cuda:
        return  # other kernels: the forward is not comparable bit for bit with the CPU's
    assert torch.equal(spec.forward(module, x), want)


@pytest.mark.parametrize("adapter", adapters.ADAPTERS, ids=lambda a: a.name)
def test_bind_into_a_module_built_beforehand(model, adapter):
    """The ``bind`` step p9_warm times apart from the construction."""
    spec, source, x, want = model
    runnable(adapter, spec)
    path = adapter.prepare(source)
    if adapter.builds_architecture:
        with pytest.raises(TypeError):
            adapter.bind(path, spec.make(True))
        return
    fresh = spec.make(adapter.meta)
    assert all(t.is_meta for t in fresh.state_dict().values()) == adapter.meta
    module = adapter.bind(path, fresh)
    assert module is fresh
    for name, ref in source.state_dict.items():
        assert same_tensor(module.state_dict()[name].cpu(), ref) == "", name


def test_every_adapter_describes_itself():
    names = [a.name for a in adapters.ADAPTERS]
    assert len(set(names)) == len(names)
    assert {"tsar", "torch.load(mmap)", "safetensors.load_file", "safetensors.safe_open",
            "tensordict.load_memmap", "transformers.from_pretrained", "fastsafetensors",
            "runai-model-streamer", "tensorizer", "tensorizer (cuda)"} <= set(names)
    for a in adapters.ADAPTERS:
        assert a.version and a.calls and a.fmt in adapters.WRITERS, a.name
        reason = a.unavailable()
        assert reason is None or reason.startswith("not measurable here: "), reason


def test_a_missing_package_is_reported_not_dropped():
    class Missing(adapters.SafetensorsLoadFile):
        name, dist, module_name = "missing", "no-such-peer-package", "no_such_peer_module"

    reason = Missing().unavailable()
    assert reason.startswith("not measurable here: no-such-peer-package is not installed")
    assert Missing().version == "not installed"


def test_p9_measures_and_reports_every_peer_asked_for(tmp_path):
    results = p9_warm.run("c", "tiny", 1, ["tsar", "safetensors.load_file", "transformers.from_pretrained"],
                          workdir=str(tmp_path), touch=True, log=lambda s: None)
    by_name = {r.adapter.name: r for r in results}
    for name in ("tsar", "safetensors.load_file"):
        r = by_name[name]
        if r.reason:
            continue  # not installed here: reported with its reason
        assert len(r.runs["bind"]) == len(r.runs["build"]) == len(r.runs["touch"]) == 1
        assert r.median("bind") > 0 and r.bind_touch() > r.median("bind") and r.file_bytes > 0
    assert by_name["transformers.from_pretrained"].reason.startswith("not applicable")
    text = p9_warm.table(results)
    assert "not applicable" in text and "calls:" in text


def _tiny_tsar_archive(tmp_path):
    """(path, files) of model (a) at the tiny size written for tsar, the
    process measures' subject; skips where tsar cannot run."""
    spec = models.spec("a", "tiny")
    source = adapters.Source(spec, spec.reference(), str(tmp_path))
    tsar_adapter = adapters.by_name(["tsar"])[0]
    runnable(tsar_adapter, spec)
    path = tsar_adapter.prepare(source)
    return path, adapters.files_of(path)


def test_p13_worker_reports_its_phases_and_p3_waits_for_the_touch(tmp_path):
    """P13's worker (procs.py) times its own phases: the loader's call, the
    first and a second forward; the own part is LOAD + FIRST - SECOND. P3's
    held workers answer only after touching every page."""
    from peers import procs

    path, files = _tiny_tsar_archive(tmp_path)
    t = procs.first_output_phases("tsar", "a", "tiny", path, files, cold=False)
    assert set(t) == {"READY", "LOAD", "FIRST", "SECOND", "OWN"}
    assert all(t[k] > 0 for k in ("LOAD", "FIRST", "SECOND"))
    assert t["READY"] > t["LOAD"] + t["FIRST"]  # exec, imports and build come first
    assert t["OWN"] == pytest.approx(t["LOAD"] + t["FIRST"] - t["SECOND"])
    floor = procs.first_output_phases("meta", "a", "tiny", "-", [], cold=False)
    assert set(floor) == {"READY"}
    whole, mapped = procs.summed_pss("tsar", "a", "tiny", path, n=1, files=files)
    assert whole > 0 and mapped > 0  # the file's pages, read by the worker before it answered


def test_p14_cold_start_reports_when_its_first_page_came_and_the_disk_is_measured_then(tmp_path):
    """P14's cold start records the seconds from the eviction to the file's
    first cached page; the disk's rate is measured that long after an
    eviction (settle), the file read whole; fresh_memory_rate times a real
    first write."""
    import time

    from peers import procs

    path, files = _tiny_tsar_archive(tmp_path)
    seen = {}
    elapsed = procs.many_cold("tsar", "a", "tiny", path, files, n=1, watch=seen)
    # The worker imports torch before it reads: the first page comes after
    # the eviction and before the answer.
    assert 0 < seen["first"] < elapsed + 1.0
    assert seen["read"] > 0
    t0 = time.perf_counter()
    rate = procs.disk_bandwidth(path, settle=0.3)
    took = time.perf_counter() - t0
    assert took >= 0.3  # it waited before reading
    assert 0 < rate < float("inf") and os.path.getsize(path) / rate <= took
    assert procs.fresh_memory_rate(8 << 20, 0.0) > 0


def test_tensordict_written_in_parts_is_what_one_memmap_writes(model, tmp_path, monkeypatch):
    """The writer splits memmap() to stay under vm.max_map_count at 100,000
    tensors; split small here, it must give the same files, byte for byte."""
    spec, source, _, _ = model
    pytest.importorskip("tensordict")
    tree = adapters._tensordict_tree(source)
    tree.memmap(str(tmp_path / "whole"))
    monkeypatch.setattr(adapters, "_MEMMAP_BATCH", 3)
    adapters._memmap_in_parts(tree, str(tmp_path / "parts"))

    def contents(root):
        out = {}
        for d, _, names in os.walk(root):
            for f in names:
                with open(os.path.join(d, f), "rb") as fh:
                    out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
        return out

    whole, parts = contents(tmp_path / "whole"), contents(tmp_path / "parts")
    assert len(whole) > 3 and sorted(whole) == sorted(parts)
    assert [k for k in whole if whole[k] != parts[k]] == []


def test_tensorizer_file_holds_the_reference_tensors_and_loads_them_bit_exactly(tmp_path):
    """The tensorizer peer (issue 44): the adapter writes a real tensorizer
    file (its magic, every state_dict name, the tied head written as a second
    copy), which TensorDeserializer reads back bit for bit, and the P9 bind
    fills a module built on meta with those bytes, ties re-made."""
    pytest.importorskip("transformers")
    spec = models.spec("b", "tiny")
    adapter = adapters.by_name(["tensorizer"])[0]
    runnable(adapter, spec)  # skips, saying why, where tensorizer does not import
    from tensorizer import TensorDeserializer

    source = adapters.Source(spec, spec.reference(), str(tmp_path))
    path = adapter.prepare(source)
    with open(path, "rb") as f:
        assert f.read(5) == b"|TZR|"
    with TensorDeserializer(path, device="cpu") as d:
        stored = dict(d)
    assert sorted(stored) == sorted(source.state_dict)
    for name, ref in source.state_dict.items():
        assert same_tensor(stored[name], ref) == "", name
    assert stored["lm_head.weight"].data_ptr() != stored["model.embed_tokens.weight"].data_ptr()

    module = adapter.bind(path, spec.make(True))
    assert module.lm_head.weight is module.model.embed_tokens.weight
    for name, ref in source.state_dict.items():
        assert same_tensor(module.state_dict()[name], ref) == "", name


def test_p8_writes_a_tensorizer_file_of_the_same_bytes(tmp_path, monkeypatch):
    """P8's tensorizer row reads a file that write_files makes from the same
    state_dict as tsar's (the head once); on the CPU here, the bytes compare
    equal with P8's own check against the archive's mapped tensors."""
    runnable(adapters.by_name(["tensorizer"])[0], None)
    from tensorizer import TensorDeserializer

    from peers import p8_gpu

    monkeypatch.setattr(p8_gpu, "HIDDEN", 64)
    monkeypatch.setattr(p8_gpu, "INTER", 96)
    monkeypatch.setattr(p8_gpu, "VOCAB", 128)
    sd = p8_gpu.make_state_dict(0.0001)
    names = [n for n in sd if n != "lm_head.weight"]
    files = p8_gpu.write_files(sd, str(tmp_path / "llama"))
    assert "tensorizer" in files and [r.fmt for r in p8_gpu.rows() if r.name == "tensorizer"] == ["tensorizer"]
    import tsar

    want = tsar.open(files["tsar"]).state_dict()
    with TensorDeserializer(files["tensorizer"], device="cpu") as d:
        got = dict(d)
    assert sorted(got) == sorted(names)
    assert p8_gpu.same_bytes(got, want, names)
