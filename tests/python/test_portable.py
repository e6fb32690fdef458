"""The portable path (tsar/_portable.py, tsar._tsar_portable), which links no
LibTorch and so runs beside any torch. Archives are written by the `tsar`
command (which needs no torch either), so that this file also runs in an
environment whose torch is not the one tsar was built against (CI runs it in
the oldest supported torch with the package built here). Where the
accelerator serves this torch too, every result is compared with its."""
import gc
import os
import signal
import zipfile

import pytest
import torch

import tsar
from tsar import _backend
from tsar_testutil import DTYPES, make_tensor, run_cli, run_python, same_tensor


ACCELERATOR = _backend.accelerator


def pack(cli, tmp_path, obj, name="m"):
    torch.save(obj, tmp_path / f"{name}.pt")
    run_cli(cli, "pack", "-q", tmp_path / f"{name}.pt", "-o", tmp_path / f"{name}.tsar")
    return tmp_path / f"{name}.tsar"


class Net(torch.nn.Module):
    def __init__(self, tie=True):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.lin = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.head = torch.nn.Linear(4, 10, bias=False)
        if tie:
            self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.tensor(2.0))
        self.register_buffer("rope", torch.arange(4.0), persistent=False)

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(h) * self.scale, self.norm(self.lin(h)) + self.rope[:3]


def net(seed=0, tie=True, meta=False):
    torch.manual_seed(seed)
    if meta:
        with torch.device("meta"):
            return Net(tie).eval()
    return Net(tie).eval()


def saved_net(cli, tmp_path, tie=True):
    """A Net's state_dict packed as save_pretrained does it: a tied weight stored once."""
    m = net(tie=tie)
    sd = m.state_dict()
    if tie:
        del sd["head.weight"]
    return m, pack(cli, tmp_path, sd)


def test_backend_says_which_path_runs(portable):
    assert tsar.backend() == f"portable (torch {torch.__version__}: TSAR_PORTABLE is set)"


def test_tsar_portable_in_the_environment_chooses_it():
    r = run_python("import os\nos.environ['TSAR_PORTABLE'] = '1'\nimport tsar\nprint(tsar.backend())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"portable (torch {torch.__version__}: TSAR_PORTABLE is set)"


def test_the_portable_extensions_link_no_libtorch():
    import subprocess

    from tsar import _tsar_pack_portable, _tsar_portable

    maps = open(f"/proc/{os.getpid()}/maps").read()
    for module in (_tsar_portable, _tsar_pack_portable):
        libs = [line.split()[-1] for line in maps.splitlines() if module.__file__ in line]
        assert libs, f"{module.__name__} is not mapped"
        needed = subprocess.run(["ldd", module.__file__], capture_output=True, text=True).stdout
        assert "libtorch" not in needed and "libc10" not in needed, needed


def test_every_dtype_comes_back_bit_exact_with_its_strides(portable, cli, tmp_path):
    sd = {f"t{i}": make_tensor(d, (3, 5), i) for i, d in enumerate(DTYPES)}
    sd["empty"] = torch.empty(0, 4)
    sd["scalar"] = torch.tensor(3.5, dtype=torch.float64)
    sd["transposed"] = torch.arange(12.0).reshape(3, 4).t()
    with tsar.open(pack(cli, tmp_path, sd)) as a:
        assert a.mode == "shared" and a.keys() == list(sd)
        got = a.state_dict()
        for k, v in sd.items():
            assert same_tensor(got[k], v) == "", k
            assert same_tensor(a[k], v) == "", k


def test_views_and_ties_share_one_storage_and_each_storage_is_its_own(portable, cli, tmp_path):
    base = torch.arange(64.0)
    sd = {"base": base, "half": base[32:], "tied": base, "other": torch.ones(3)}
    with tsar.open(pack(cli, tmp_path, sd)) as a:
        got = a.state_dict()
    assert got["half"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()
    assert got["half"].storage_offset() == 32 and torch.equal(got["half"], base[32:])
    assert got["tied"].data_ptr() == got["base"].data_ptr()
    # One torch storage per archive storage, not the whole file: torch.save and
    # safetensors see the tensors that shared memory when saved, and no others.
    assert got["other"].untyped_storage().data_ptr() != got["base"].untyped_storage().data_ptr()
    assert got["other"].untyped_storage().nbytes() < 4096
    back = tmp_path / "back.pt"
    torch.save(got, back)  # the original's storages, not the mapped file's pages

    def storages(path):
        with zipfile.ZipFile(path) as z:
            return sorted(i.file_size for i in z.infolist() if "/data/" in i.filename
                          and not i.filename.endswith("serialization_id"))

    assert storages(back) == storages(tmp_path / "m.pt") == [12, 256]


def test_tensors_outlive_the_archive_and_copy_on_write_is_writable(portable, cli, tmp_path):
    path = pack(cli, tmp_path, {"w": torch.arange(6.0)})
    a = tsar.open(path)
    w = a["w"]
    a.close()
    del a
    gc.collect()
    assert torch.equal(w, torch.arange(6.0))
    with tsar.open(path, mode="copy_on_write") as a:
        w = a["w"]
        w.add_(1)
        assert torch.equal(a["w"], torch.arange(6.0) + 1)  # one storage, private pages
    with tsar.open(path) as a:
        assert torch.equal(a["w"], torch.arange(6.0))  # the file never changed


def test_load_into_binds_in_place_on_cpu_and_meta_with_the_tie(portable, cli, tmp_path):
    m, path = saved_net(cli, tmp_path)
    ids = torch.tensor([1, 2, 3])
    for meta in (False, True):
        fresh = net(seed=1, meta=meta)
        if meta:  # the non-persistent buffer no archive holds, given its value
            fresh.rope = torch.arange(4.0)
        params = {n: p for n, p in fresh.named_parameters(remove_duplicate=False)}
        archive = tsar.open(path)
        report = tsar.load_into(fresh, archive)
        assert report.tied == ["head.weight"] and report.missing == [] and report.mismatched == []
        assert sorted(report.bound) == sorted(set(m.state_dict()) - {"head.weight"})
        for n, p in fresh.named_parameters(remove_duplicate=False):
            assert p is params[n] and p.device.type == "cpu", n
        assert fresh.head.weight is fresh.emb.weight
        assert all(p.requires_grad for p in fresh.parameters())
        for got, want in zip(fresh(ids), m(ids)):
            assert torch.equal(got, want)
        assert fresh.lin.weight.data_ptr() == archive["lin.weight"].data_ptr()  # zero copy
        archive.close()


def _fast(path, module, strict=True, **kw):
    """_tsar_portable.bind_fast (python/src/portable_bind.h) on ``module``:
    its report, or None where it leaves the bind to tsar/_portable_bind.py."""
    from tsar import _tsar_portable
    from tsar._module_state import PLAIN, plain

    a = (path if isinstance(path, tsar.Archive) else tsar.open(path))._a()
    options = ("", kw.get("archive_prefix", ""), kw.get("module_prefix", ""), strict, False,
               kw.get("rank", 0), kw.get("world", 0))
    return _tsar_portable.bind_fast(a._file, module, None, False, None, options,
                                    a.bind_api(PLAIN, plain))


def _state(module):
    return [(n, t.device.type, t.data_ptr(), t.requires_grad)
            for n, t in module.state_dict(keep_vars=True).items()]


def test_the_common_binds_run_in_cpp_and_the_rest_fall_back_with_nothing_changed(
        portable, cli, tmp_path):
    m, path = saved_net(cli, tmp_path)
    ids = torch.tensor([1, 2, 3])
    # Answered in C++: cpu, meta, the tie, a module name the archive lacks.
    for meta in (False, True):
        fresh = net(seed=1, meta=meta)
        fresh.rope = torch.arange(4.0)
        params = dict(fresh.named_parameters(remove_duplicate=False))
        report = _fast(path, fresh)
        assert report is not None and report[4] == ["head.weight"] and report[1:4] == ([], [], [])
        assert all(p is params[n] and p.device.type == "cpu" and p.requires_grad
                   for n, p in fresh.named_parameters(remove_duplicate=False))
        assert fresh.head.weight is fresh.emb.weight
        assert all(torch.equal(g, w) for g, w in zip(fresh(ids), m(ids)))
    extra = net(seed=1)
    extra.register_buffer("extra", torch.zeros(2))
    report = _fast(path, extra, strict=False)
    assert report is not None and report[1] == ["extra"]
    assert extra.extra.data_ptr() != 0 and torch.equal(extra.extra, torch.zeros(2))
    # Left to Python, untouched: what the rules report or refuse.
    other_shape = net(seed=1)
    other_shape.lin = torch.nn.Linear(4, 5)
    stays_meta = net(seed=1, meta=True)  # rope on meta, which no archive holds
    other_dtype = net(seed=1).to(torch.float64)
    for module, kw in ((other_shape, {}), (stays_meta, {}), (other_dtype, {}), (extra, {}),
                       (net(seed=1), {"module_prefix": "x."})):
        before = _state(module)
        assert _fast(path, module, **kw) is None
        assert _state(module) == before


class Mlp(torch.nn.Module):
    def __init__(self, world=1, tie=False):
        super().__init__()
        self.up = torch.nn.Linear(8, 16 // world, bias=False)
        self.down = torch.nn.Linear(16 // world, 8, bias=False)
        self.norm = torch.nn.Parameter(torch.arange(8.0))
        self.head = torch.nn.Linear(16 // world, 8, bias=False)
        if tie:
            self.head.weight = self.down.weight


def test_a_rank_of_the_archive_s_world_binds_in_cpp_to_its_blocks(portable, tmp_path):
    torch.manual_seed(3)
    full = Mlp(tie=True)
    path = tmp_path / "tp.tsar"
    tsar.save(full, path, tp=2, shard={"up.*": 0, "down.*": 1, "head.*": 1})
    a = tsar.open(path)
    lo, hi = a._a().data_ptr, a._a().data_ptr + a._a().mapped_size
    for rank in range(2):
        for meta in (False, True):
            with torch.device("meta" if meta else "cpu"):
                m = Mlp(world=2, tie=True).eval()
            report = _fast(a, m, rank=rank, world=2)
            assert report is not None and sorted(report[0]) == [  # both names: one storage
                "down.weight", "head.weight", "norm", "up.weight"] and report[1:] == ([],) * 4
            assert m.head.weight is m.down.weight
            assert torch.equal(m.up.weight, full.up.weight.chunk(2, 0)[rank])
            assert torch.equal(m.down.weight, full.down.weight.chunk(2, 1)[rank])
            assert torch.equal(m.norm, full.norm)
            # The rank's block itself: contiguous, in the mapping, its own storage.
            w = m.down.weight
            assert w.is_contiguous() and lo <= w.data_ptr() < hi
            assert w.untyped_storage().nbytes() == w.numel() * 4
    # Left to Python, untouched: another world, a module tied where the
    # archive is not (two objects over one sharded storage), a wrong rank.
    for kw, module in (({"rank": 0, "world": 4}, Mlp(world=4).eval()),
                       ({"rank": 1, "world": 2}, Mlp(world=2).eval()),
                       ({"rank": 2, "world": 2}, Mlp(world=2).eval())):
        before = _state(module)
        assert _fast(path, module, **kw) is None
        assert _state(module) == before
    untied = Mlp(world=2).eval()
    tsar.load_into(untied, path, rank=1, world=2)
    assert torch.equal(untied.head.weight, untied.down.weight)
    storage = untied.down.weight.untyped_storage()._cdata
    assert untied.head.weight.untyped_storage()._cdata == storage  # one storage, as the archive


class Buffers(torch.nn.Module):
    """One buffer per dtype of DTYPES (those this torch has), and a transposed one."""

    def __init__(self, values=None):
        super().__init__()
        for name, t in (values or {}).items():
            self.register_buffer(name, t)


def test_every_dtype_binds_onto_meta_bit_exact_with_its_strides(portable, cli, tmp_path):
    # DLPack (a storage of its own) for most dtypes, frombuffer + as_strided
    # for the rest (bool, float8...) and for views: each as torch made it.
    sd = {f"t{i}": make_tensor(d, (3, 4), seed=i) for i, d in enumerate(DTYPES)}
    sd["transposed"] = torch.arange(12.0).reshape(3, 4).t()
    # No dimension, then the DLPack shape's inline room (8) and past it, strided.
    sd["scalar"] = torch.tensor(3.5)
    sd["dims8"] = torch.arange(256.0).reshape((2,) * 8)
    sd["dims11"] = torch.arange(1536.0).reshape((3,) + (2,) * 9 + (1,)).transpose(0, 1)
    base = torch.arange(8.0)
    sd["view_a"], sd["view_b"] = base[:4], base[4:]
    path = pack(cli, tmp_path, sd)
    with torch.device("meta"):
        fresh = Buffers({k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)
                         for k, v in sd.items()}).eval()
    report = tsar.load_into(fresh, path)
    assert sorted(report.bound) == sorted(sd)
    for k, v in sd.items():
        got = getattr(fresh, k)
        assert got.device.type == "cpu" and same_tensor(got, v) == "", k
    assert fresh.view_a.untyped_storage()._cdata == fresh.view_b.untyped_storage()._cdata
    assert fresh.view_a.untyped_storage().nbytes() == 8 * 4  # the archive's storage, not the file


def test_a_bind_makes_one_torch_storage_per_shared_archive_storage(portable, tmp_path):
    # Views and a storage viewed as two dtypes (tsar.save keeps both; torch.save
    # refuses them): on both paths, each archive storage the module's tensors
    # share is one torch storage of its own size, and each tensor its bytes.
    base, raw = torch.arange(8.0), torch.arange(8, dtype=torch.int32) * 3
    sd = {"a": base[:4], "b": base[4:], "whole": base, "as_int": raw,
          "as_float": raw.view(torch.float32), "alone": torch.ones(3)}
    tsar.save(sd, tmp_path / "x.tsar")
    for accelerator in {ACCELERATOR, None}:
        _backend.accelerator = accelerator  # (the fixture puts it back after the test)
        with torch.device("meta"):
            fresh = Buffers({k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)
                             for k, v in sd.items()}).eval()
        assert sorted(tsar.load_into(fresh, tmp_path / "x.tsar").bound) == sorted(sd)
        got = dict(fresh.named_buffers())
        for k, v in sd.items():
            assert same_tensor(got[k], v) == "", (accelerator, k)
        storage = {k: (t.untyped_storage()._cdata, t.untyped_storage().nbytes())
                   for k, t in got.items()}
        assert storage["a"] == storage["b"] == storage["whole"], accelerator
        assert storage["as_int"] == storage["as_float"], accelerator
        assert storage["a"][1] == storage["as_int"][1] == 32 and storage["alone"][1] == 12
        assert len({c for c, _ in storage.values()}) == 3, accelerator


def test_a_bound_module_outlives_its_archive(portable, cli, tmp_path):
    m, path = saved_net(cli, tmp_path)
    fresh = net(seed=1, meta=True)
    fresh.rope = torch.arange(4.0)
    archive = tsar.open(path)
    tsar.load_into(fresh, archive)
    archive.close()
    del archive
    gc.collect()
    for (n, got), want in zip(fresh.state_dict().items(), m.state_dict().values()):
        assert torch.equal(got, want), n
    # Each tensor of a storage of its own has a torch storage of its own
    # (torch.save sees the archive's storages, not the file).
    assert fresh.lin.weight.untyped_storage().nbytes() == 3 * 4 * 4


def test_a_dropped_module_unmaps_its_archive_without_a_garbage_collection(portable, cli,
                                                                         tmp_path):
    # Nothing but the module's tensors holds the mapping once load_into has
    # returned: no reference cycle waits for the collector (a hot-swapping
    # server's old versions stayed mapped while one did).
    _, path = saved_net(cli, tmp_path)
    gc.collect()
    gc.disable()
    try:
        for meta in (True, False):
            fresh = net(seed=1, meta=meta)
            fresh.rope = torch.arange(4.0)
            tsar.load_into(fresh, path)
            assert str(path) in open("/proc/self/maps").read()
            del fresh
            assert str(path) not in open("/proc/self/maps").read(), meta
    finally:
        gc.enable()


def test_meta_is_never_left_behind(portable, cli, tmp_path):
    _, path = saved_net(cli, tmp_path)
    fresh = net(meta=True)
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(fresh, path, strict=False)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "'rope'" not in str(e.value) and "rope (non-persistent buffers" in str(e.value)
    assert fresh.lin.weight.is_meta  # nothing changed


def reports(path, make, **kw):
    """load_into's BindReport, or the tsar.Error's (code, message), for a fresh module."""
    try:
        return tuple(tsar.load_into(make(), path, **kw))
    except tsar.Error as e:
        return (e.code, str(e))


CASES = {
    "strict": {},
    "loose": {"strict": False},
    "prefixes": {"strict": False, "module_prefix": "lin.", "archive_prefix": "lin."},
    "training": {"allow_training": False},
    "bad_rank": {"rank": 1},
}


@pytest.mark.skipif(ACCELERATOR is None, reason="the accelerator does not serve this torch")
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("module", ["same", "untied", "other_shape", "other_dtype", "tied_twins",
                                    "meta", "meta_rope", "tie_stored_once"])
def test_reports_and_errors_equal_the_accelerators(cli, tmp_path, monkeypatch, case, module):
    m = net(tie=module != "tied_twins")
    sd = m.state_dict()
    if module == "tied_twins":  # tied in the module, two different values in the archive
        sd["head.weight"] = sd["head.weight"] + 1
    if module == "tie_stored_once":  # as save_pretrained stores it
        del sd["head.weight"]
    path = pack(cli, tmp_path, sd)

    def make():
        if module.startswith("meta"):
            f = net(meta=True)
            if module == "meta":
                f.rope = torch.arange(4.0)
        elif module == "untied":
            f = net(tie=False)
        elif module == "other_shape":
            f = net()
            f.lin = torch.nn.Linear(4, 5)
        elif module == "other_dtype":
            f = net().to(torch.float64)
        else:
            f = net()
        return f.train() if case == "training" else f.eval()

    want = reports(path, make, **CASES[case])
    monkeypatch.setattr(_backend, "accelerator", None)
    got = reports(path, make, **CASES[case])
    assert got == want


@pytest.mark.parametrize("world", [2, 3])
def test_a_ranks_slices_equal_torch_chunk(portable, cli, tmp_path, world):
    torch.manual_seed(0)
    full = torch.nn.Linear(12, 6)
    path = pack(cli, tmp_path, full.state_dict())
    for rank in range(world):
        part = torch.nn.Linear(12, 6).eval()
        part.weight = torch.nn.Parameter(torch.empty(torch.chunk(full.weight, world, 0)[rank].shape))
        report = tsar.load_into(part, path, rank=rank, world=world)
        assert report.mismatched == []
        assert torch.equal(part.weight, torch.chunk(full.weight, world, 0)[rank])
        assert torch.equal(part.bias, full.bias)  # whole: replicated
        with tsar.open(path) as a:
            assert torch.equal(a.shard("weight", rank, world, 0),
                               torch.chunk(full.weight, world, 0)[rank])


def test_pack_on_the_portable_path_writes_the_commands_bytes(portable, cli, tmp_path):
    torch.manual_seed(0)
    sd = {"w": torch.randn(4, 3), "b": torch.arange(5, dtype=torch.int64), "v": None}
    sd["v"] = sd["w"][1:]  # a view: one storage
    torch.save(sd, tmp_path / "m.pt")
    run_cli(cli, "pack", "-q", tmp_path / "m.pt", "-o", tmp_path / "cli.tsar")
    summary = tsar.pack(tmp_path / "m.pt", tmp_path / "py.tsar")
    assert summary.tensors == 3 and summary.entries == ["model"]
    assert (tmp_path / "py.tsar").read_bytes() == (tmp_path / "cli.tsar").read_bytes()
    # Options and several inputs, as the command takes them.
    run_cli(cli, "pack", "-q", "--entry", "a=" + str(tmp_path / "m.pt"), "--entry",
            "b=" + str(tmp_path / "cli.tsar"), "--dtype", "bfloat16", "-o", tmp_path / "cli2.tsar")
    tsar.pack({"a": tmp_path / "m.pt", "b": tmp_path / "cli.tsar"}, tmp_path / "py2.tsar",
              dtype=torch.bfloat16)
    assert (tmp_path / "py2.tsar").read_bytes() == (tmp_path / "cli2.tsar").read_bytes()
    with tsar.open(tmp_path / "py2.tsar") as a:
        assert a.state_dict("a")["w"].dtype == torch.bfloat16


class Scripted(torch.nn.Module):
    """What a TorchScript input holds: an LSTM (whose _flat_weights list
    references its parameters), running statistics, a tie and a scalar."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 6)
        self.lstm = torch.nn.LSTM(6, 5, batch_first=True)
        self.norm = torch.nn.BatchNorm1d(5)
        self.head = torch.nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, ids):
        h = self.emb(ids)
        o, _ = self.lstm(h)
        return self.head(h).sum(1) * self.scale + self.norm(o[:, -1]).sum()


def test_torchscript_inputs_and_arch_files_through_this_torch(portable, tmp_path):
    """tsar.pack of a TorchScript file and its arch= on the portable path, read
    and written by this process's torch (tsar/_portable_torchscript.py): every
    tensor in LibTorch's order, the tie one storage, an architecture without
    weight bytes that binds back to the model's outputs; the same bytes as
    the accelerator where it serves this torch."""
    torch.manual_seed(0)
    model = Scripted().eval()
    with torch.no_grad():
        model.norm.running_mean.uniform_()
    torch.jit.save(torch.jit.script(model), tmp_path / "ts.pt")
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with torch.no_grad():
        want = model(ids)
    os.mkdir(tmp_path / "p")
    summary = tsar.pack(tmp_path / "ts.pt", tmp_path / "p" / "m.tsar", arch=tmp_path / "p" / "arch.pt")
    sd = model.state_dict()
    assert summary.entries == ["model"] and summary.tensors == len(sd)
    with tsar.open(tmp_path / "p" / "m.tsar") as a:
        got = a.state_dict()
        assert list(got) == list(sd)
        assert all(torch.equal(got[n], t) for n, t in sd.items())
        assert got["head.weight"].data_ptr() == got["emb.weight"].data_ptr()
        assert got["lstm.weight_ih_l0"].requires_grad and not got["norm.running_mean"].requires_grad
    arch = torch.jit.load(tmp_path / "p" / "arch.pt").eval()
    for name, t in arch.state_dict().items():
        assert (t.shape, t.dtype) == (sd[name].shape, sd[name].dtype), name
        assert t.numel() <= 1 or set(t.stride()) == {0}, name
    assert os.path.getsize(tmp_path / "p" / "arch.pt") < os.path.getsize(tmp_path / "ts.pt")
    assert arch.lstm._flat_weights[0] is arch.lstm.weight_ih_l0
    report = tsar.load_into(arch, tmp_path / "p" / "m.tsar")
    assert report.missing == [] and report.unexpected == []
    with torch.no_grad():
        assert torch.equal(arch(ids), want)
    if ACCELERATOR is not None:
        _backend.accelerator = ACCELERATOR  # (the fixture puts it back after the test)
        os.mkdir(tmp_path / "a")
        tsar.pack(tmp_path / "ts.pt", tmp_path / "a" / "m.tsar", arch=tmp_path / "a" / "arch.pt")
        for name in ("m.tsar", "arch.pt"):
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "p" / name).read_bytes(), name


def test_a_torchscript_input_this_torch_cannot_load_is_bad_input_and_nothing_is_written(
        portable, tmp_path):
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "ts.pt")
    with zipfile.ZipFile(tmp_path / "ts.pt") as good, \
            zipfile.ZipFile(tmp_path / "bad.pt", "w") as bad:
        for info in good.infolist():
            if not info.filename.endswith("/data.pkl"):
                bad.writestr(info, good.read(info))
    for arch in (None, tmp_path / "x.arch"):
        with pytest.raises(tsar.Error) as e:
            tsar.pack(tmp_path / "bad.pt", tmp_path / "x.tsar", arch=arch)
        assert e.value.code == tsar.ErrorCode.BAD_INPUT and e.value.path == str(tmp_path / "bad.pt")
        assert "not a loadable TorchScript archive: " in str(e.value), e.value
        assert sorted(os.listdir(tmp_path)) == ["bad.pt", "ts.pt"]
    # A module without parameters or buffers: refused as the accelerator
    # refuses it (importer::Import, whichever reader read it).
    torch.jit.save(torch.jit.script(torch.nn.ReLU()), tmp_path / "relu.pt")
    for accelerator in {ACCELERATOR, None}:
        _backend.accelerator = accelerator  # (the fixture puts it back after the test)
        with pytest.raises(tsar.Error) as e:
            tsar.pack(tmp_path / "relu.pt", tmp_path / "x.tsar")
        assert e.value.code == tsar.ErrorCode.BAD_INPUT and e.value.path == str(tmp_path / "relu.pt")
        assert "expected parameters or buffers in the TorchScript module, found none" in str(e.value)
    _backend.accelerator = None
    os.remove(tmp_path / "relu.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "sd.pt")
    with pytest.raises(tsar.Error, match="--arch: this is a torch.save file, which holds weights only"):
        tsar.pack(tmp_path / "sd.pt", tmp_path / "x.tsar", arch=tmp_path / "x.arch")
    with pytest.raises(tsar.Error, match='tensor "m": tensors on meta cannot be packed'):
        tsar.save({"m": torch.empty(3, device="meta")}, tmp_path / "x.tsar")
    assert sorted(os.listdir(tmp_path)) == ["bad.pt", "sd.pt", "ts.pt"]
    # The private packer called without the hooks tsar.pack passes: refused,
    # naming tsar.pack().
    from tsar import _tsar_pack_portable
    with pytest.raises(tsar.Error) as e:
        _tsar_pack_portable.pack([("", str(tmp_path / "ts.pt"))], str(tmp_path / "x.tsar"), "",
                                 True, 4096, [], "", [], [], "", "")
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED and e.value.path == str(tmp_path / "ts.pt")
    assert "only through the process's torch, given as torch_hooks" in str(e.value)
    assert "call tsar.pack()" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["bad.pt", "sd.pt", "ts.pt"]


def test_integrity_and_metadata_as_on_the_accelerator(portable, cli, tmp_path):
    path = pack(cli, tmp_path, {"w": torch.arange(1000.0), "v": torch.ones(3)})
    with tsar.open(path, verify="full") as a:
        a.verify()
        assert a.damaged() == []
        info = a.info("w")
        assert info.dtype == torch.float32 and info.shape == (1000,)
    data = bytearray(path.read_bytes())
    with tsar.open(path) as a:
        at = a["w"].data_ptr() - a._a().data_ptr
    data[at + 8] ^= 0xFF
    path.write_bytes(bytes(data))
    with tsar.open(path) as a:
        assert a.damaged() == ["model/w"] or a.damaged() == ["w"] or "w" in a.damaged()[0]
        with pytest.raises(tsar.Error) as e:
            a.verify()
        assert e.value.code == tsar.ErrorCode.CHECKSUM_MISMATCH


def test_live_module_swaps_on_the_portable_path(portable, cli, tmp_path):
    target = tmp_path / "live.tsar"
    os.replace(pack(cli, tmp_path, {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}, "v1"),
               target)
    live = tsar.LiveModule(target, lambda: torch.nn.Linear(2, 2).eval(), poll_interval=0,
                           inotify=False)
    try:
        assert torch.equal(live.get().weight, torch.ones(2, 2))
        os.replace(pack(cli, tmp_path, {"weight": torch.full((2, 2), 3.0), "bias": torch.zeros(2)},
                        "v2"), target)
        live.check()
        assert live.version == 2 and torch.equal(live.get().weight, torch.full((2, 2), 3.0))
    finally:
        live.close()


def _every_kind_of_state_dict():
    sd = {f"t{i}": make_tensor(d, (3, 5), i) for i, d in enumerate(DTYPES)}
    base = torch.arange(64.0)
    sd.update(base=base, half=base[32:], tied=base, transposed=torch.arange(12.0).reshape(3, 4).t(),
              empty=torch.empty(0, 4), scalar=torch.tensor(2.5))
    sd["param"] = torch.nn.Parameter(torch.ones(2))
    return sd


def test_save_on_the_portable_path_round_trips(portable, tmp_path):
    sd = _every_kind_of_state_dict()
    tsar.save(sd, tmp_path / "p.tsar", metadata={"step": 3, "note": "x"})
    with tsar.open(tmp_path / "p.tsar", verify="full") as a:
        got = a.state_dict()
        assert list(got) == list(sd) and a.metadata()["step"] == 3
        for k, v in sd.items():
            assert same_tensor(got[k], v.detach()) == "", k
        assert got["half"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()
        assert a.info("param").role == "parameter" and a.info("param").requires_grad


@pytest.mark.skipif(ACCELERATOR is None, reason="the accelerator does not serve this torch")
@pytest.mark.parametrize("what", ["state_dict", "module", "layer", "tp"])
def test_save_writes_the_accelerators_bytes(tmp_path, monkeypatch, what):
    """Deterministic whichever path writes: the same tensors, the same file."""
    if what == "module":
        obj, kw = net(), {}
    elif what == "layer":
        tsar.save(net().state_dict(), tmp_path / "base.tsar")
        sd = net().state_dict()
        sd["lin.weight"] = sd["lin.weight"] + 1
        obj, kw = sd, {"base": tmp_path / "base.tsar"}
    elif what == "tp":
        torch.manual_seed(0)
        obj, kw = torch.nn.Linear(8, 6).state_dict(), {"tp": 2, "shard": {"weight": 0}}
    else:
        obj, kw = _every_kind_of_state_dict(), {"dtype": None}
    tsar.save(obj, tmp_path / "acc.tsar", **kw)
    monkeypatch.setattr(_backend, "accelerator", None)
    tsar.save(obj, tmp_path / "port.tsar", **kw)
    assert (tmp_path / "acc.tsar").read_bytes() == (tmp_path / "port.tsar").read_bytes()


def test_the_fault_handler_names_what_was_written_on_the_portable_path(cli, tmp_path):
    path = pack(cli, tmp_path, {"bias": torch.zeros(3), "weights": torch.zeros(64 * 1024)})
    code = ("import os, sys\n"
            "os.environ['TSAR_PORTABLE'] = '1'\n"
            "import tsar\n"
            "tsar.install_fault_handler()\n"
            "w = tsar.open(sys.argv[1])['weights']\n"
            "w.add_(1)\n"
            "print('survived', flush=True)\n")
    r = run_python(code, path)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tsar: write to read-only archive ")]
    assert len(lines) == 1 and str(path) in lines[0] and '"weights"' in lines[0], r.stderr


def test_sparse_tensors_come_back_as_the_accelerators(portable, samples):
    path = os.path.join(samples, "valid", "sparse.tsar")
    with tsar.open(path) as a:
        got = a.state_dict()
        assert list(got) == ["bias", "adj", "m"]
        assert got["adj"].layout == torch.sparse_coo and got["m"].layout == torch.sparse_csr
        assert got["adj"]._values().data_ptr() == a.tensor("adj.values").data_ptr()  # zero copy
    if ACCELERATOR is not None:
        _backend.accelerator = ACCELERATOR  # (the fixture puts it back after the test)
        with tsar.open(path) as a:
            want = a.state_dict()
        for k in want:
            assert want[k].layout == got[k].layout, k
            assert torch.equal(want[k].to_dense(), got[k].to_dense()), k
        assert got["adj"].is_coalesced() == want["adj"].is_coalesced()


def test_save_writes_sparse_tensors_as_the_accelerator_does(portable, tmp_path):
    """COO (coalesced or not), CSR and CSC: the accelerator's components, in its
    order and names, the same bytes where it serves this torch; a layout the
    format lacks is refused, naming the tensor, and nothing is written."""
    i = torch.tensor([[0, 1, 2, 0], [2, 0, 1, 2]])
    sd = {"bias": torch.arange(3.0),
          "adj": torch.sparse_coo_tensor(i, torch.arange(4.0), (3, 3)).coalesce(),
          "raw": torch.sparse_coo_tensor(i, torch.ones(4, dtype=torch.float16), (3, 3)),
          "csr": torch.arange(12.0).reshape(3, 4).relu().to_sparse_csr(),
          "csc": torch.eye(3, dtype=torch.float64).to_sparse_csc()}
    tsar.save(sd, tmp_path / "p.tsar")
    with tsar.open(tmp_path / "p.tsar") as a:
        got = a.state_dict()
        assert list(got) == list(sd)
        for name, want in sd.items():
            assert got[name].layout == want.layout and got[name].dtype == want.dtype, name
            assert torch.equal(got[name].to_dense(), want.to_dense()), name
        assert got["adj"].is_coalesced() and not got["raw"].is_coalesced()
        assert torch.equal(a.tensor("raw.indices"), i)  # not coalesced: as given
        assert torch.equal(a.tensor("csr.crow_indices"), sd["csr"].crow_indices())
        assert torch.equal(a.tensor("csc.row_indices"), sd["csc"].row_indices())
    if ACCELERATOR is not None:
        _backend.accelerator = ACCELERATOR  # (the fixture puts it back after the test)
        tsar.save(sd, tmp_path / "a.tsar")
        assert (tmp_path / "a.tsar").read_bytes() == (tmp_path / "p.tsar").read_bytes()
        _backend.accelerator = None
    bsr = torch.eye(4).to_sparse_bsr((2, 2))
    with pytest.raises(tsar.Error, match='tensor "b": layout torch.sparse_bsr is not supported'):
        tsar.save({"w": torch.ones(2), "b": bsr}, tmp_path / "x.tsar")
    assert not (tmp_path / "x.tsar").exists()


def test_threads_reading_at_once_share_one_storage_per_archive_storage(portable, cli, tmp_path):
    import threading

    sd = {f"w{i}": torch.full((4,), float(i)) for i in range(200)}
    a = tsar.open(pack(cli, tmp_path, sd))
    results, start = [], threading.Barrier(8)

    def read():
        start.wait()
        results.append(a.state_dict())

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, want in sd.items():
        ids = {r[name].untyped_storage()._cdata for r in results}
        assert len(ids) == 1 and all(torch.equal(r[name], want) for r in results), name


def test_state_dict_and_single_tensors_share_one_storage_per_archive_storage(
        portable, cli, tmp_path):
    """state_dict() makes its tensors in C++ (a storage's flat tensor through
    DLPack, then as_strided) and view() in Python: either way round, one torch
    storage per archive storage, and each tensor its bytes."""
    w = torch.arange(12.0).reshape(3, 4)
    sd = {"w": w, "w_t": w.t(), "w_row": w[1], "h": torch.arange(6, dtype=torch.float16),
          "b": torch.tensor([True, False]), "p": torch.nn.Parameter(torch.ones(2))}
    path = pack(cli, tmp_path, sd)
    for first in ("state_dict", "tensor"):
        with tsar.open(path) as a:
            single = {n: a[n] for n in sd} if first == "tensor" else None
            got = a.state_dict()
            single = single or {n: a[n] for n in sd}
            for n, want in sd.items():
                assert same_tensor(got[n], want.detach()) == "", (first, n)
                assert (got[n].untyped_storage()._cdata
                        == single[n].untyped_storage()._cdata), (first, n)
                assert got[n].data_ptr() == single[n].data_ptr(), (first, n)
            assert got["w_t"].untyped_storage()._cdata == got["w"].untyped_storage()._cdata
            assert got["p"].requires_grad and not got["w"].requires_grad
            again = a.state_dict()
            assert all(again[n].untyped_storage()._cdata == got[n].untyped_storage()._cdata
                       and again[n] is not got[n] for n in sd)
            # What a caller does to a tensor it was given reaches no other one.
            got["h"].requires_grad_(True)
            got["b"].unsqueeze_(0)
            assert not a["h"].requires_grad and a["h"].grad_fn is None
            assert a["b"].shape == (2,) and a.state_dict()["b"].shape == (2,)


def test_sparse_indices_out_of_range_are_invalid_value_on_both_paths(tmp_path, monkeypatch):
    bad = torch.sparse_coo_tensor(torch.tensor([[0, 7], [1, 0]]), torch.ones(2), (3, 3),
                                  check_invariants=False)
    tsar.save({"adj": bad}, tmp_path / "bad.tsar")
    codes = []
    for accelerator in {ACCELERATOR, None}:
        monkeypatch.setattr(_backend, "accelerator", accelerator)
        with tsar.open(tmp_path / "bad.tsar") as a:
            with pytest.raises(tsar.Error) as e:
                a["adj"]
        assert 'sparse tensor "adj"' in str(e.value) and str(tmp_path / "bad.tsar") in str(e.value)
        codes.append(e.value.code)
    assert codes == [tsar.ErrorCode.INVALID_VALUE] * len(codes)
