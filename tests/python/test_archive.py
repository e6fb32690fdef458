"""The Archive object: metadata, entries, lookups, modes, prefetch, lifetime."""
import gc
import os
import resource
import subprocess
import sys

import pytest
import torch

import tsar
from tsar_testutil import child_env, in_mapping, mapped_ranges, same_tensor


def two_entries():
    g = torch.Generator().manual_seed(0)
    model = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    ema = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g),
           "step": torch.tensor(5)}
    return model, ema


META = {"name": "tiny é", "empty": "", "step": -10, "big": 2**62, "lr": 0.25, "nan_free": 1e-300,
        "blob": b"\x00\xff\x10", "no_bytes": b""}


def test_metadata_round_trip(tmp_path):
    path = str(tmp_path / "m.tsar")
    tsar.save({"w": torch.ones(2)}, path, metadata=META)
    with tsar.open(path) as a:
        got = a.metadata()
        assert got == META
        for k, v in META.items():
            assert type(got[k]) is type(v), k
        assert a.metadata("model") == {}


@pytest.mark.parametrize("bad", [True, False])
def test_bool_metadata_is_refused(tmp_path, bad):
    path = str(tmp_path / "b.tsar")
    with pytest.raises(TypeError):
        tsar.save({"w": torch.ones(2)}, path, metadata={"flag": bad})
    assert not os.path.exists(path), "a refused save must not leave a file"


def test_several_entries(tmp_path):
    model, ema = two_entries()
    path = str(tmp_path / "e.tsar")
    tsar.save({"model": model, "ema": ema}, path, metadata={"step": 1000})
    with tsar.open(path) as a:
        assert a.entries == ["model", "ema"]
        assert a.keys() == a.keys("model") == ["w", "b"]
        assert a.keys("ema") == ["w", "b", "step"]
        assert len(a) == 2 and list(a) == ["w", "b"]
        assert "w" in a and "step" not in a and "nope" not in a
        for name, t in model.items():
            assert same_tensor(a[name], t) == "" and same_tensor(a.tensor(name), t) == ""
            assert same_tensor(a.tensor(name, entry="model"), t) == ""
        for name, t in ema.items():
            assert same_tensor(a.tensor(name, entry="ema"), t) == ""
            assert a.info(name, entry="ema").entry == "ema"
        sd = a.state_dict("ema")
        assert list(sd) == ["w", "b", "step"] and type(sd).__name__ == "OrderedDict"
        assert a.metadata() == {"step": 1000}
        assert a.metadata("ema") == {}
        for call in [lambda: a.tensor("nope"), lambda: a.tensor("step"), lambda: a.tensor("w", entry="nope"),
                     lambda: a.info("nope"), lambda: a.keys("nope"), lambda: a.state_dict("nope"),
                     lambda: a.metadata("nope")]:
            with pytest.raises(tsar.Error) as ei:
                call()
            assert ei.value.code == tsar.ErrorCode.NOT_FOUND
        with pytest.raises((tsar.Error, KeyError)) as ei:
            a["nope"]
        assert not isinstance(ei.value, tsar.Error) or ei.value.code == tsar.ErrorCode.NOT_FOUND


def test_entry_name_and_alignment(tmp_path):
    path = str(tmp_path / "c.tsar")
    tsar.save({"w": torch.ones(5000)}, path, entry="ckpt", alignment=64)
    with tsar.open(path) as a:
        assert a.entries == ["ckpt"] and a.keys() == ["w"]
        assert a.alignment == 64
        assert a.format_version == (1, 0)
        assert a.file_size == os.path.getsize(path)
        assert a.path == path and a.mode == "shared"
        assert torch.equal(a["w"], torch.ones(5000))
    big = str(tmp_path / "d.tsar")
    tsar.save({"w": torch.ones(5000)}, big)
    with tsar.open(big) as a:
        assert a.alignment == 4096
    assert os.path.getsize(big) > os.path.getsize(path)


def test_load_returns_a_plain_dict_of_zero_copy_tensors(tmp_path):
    model, ema = two_entries()
    path = str(tmp_path / "e.tsar")
    tsar.save({"model": model, "ema": ema}, path)
    d = tsar.load(path)
    assert isinstance(d, dict)
    assert list(d) == ["w", "b"]
    for name, t in model.items():
        assert same_tensor(d[name], t) == ""
        assert in_mapping(d[name].data_ptr(), mapped_ranges(path))
    e = tsar.load(path, entry="ema")
    assert list(e) == ["w", "b", "step"]
    assert torch.equal(e["step"], torch.tensor(5))


def test_tensors_outlive_the_archive(tmp_path):
    path = str(tmp_path / "l.tsar")
    want = {"x": torch.arange(100000, dtype=torch.float64), "y": torch.full((3, 3), 2.5)}
    tsar.save(want, path)
    a = tsar.open(path)
    sd = a.state_dict()
    x = a["x"]
    del a
    gc.collect()
    assert mapped_ranges(path), "the tensors keep the mapping alive"
    assert torch.equal(x, want["x"]) and x.sum().item() == sum(range(100000))
    assert torch.equal(sd["y"], want["y"])
    with tsar.open(path) as b:
        y = b["y"]
    b.close()  # closing twice is harmless
    gc.collect()
    assert torch.equal(y, want["y"])
    del x, sd, y
    gc.collect()
    assert mapped_ranges(path) == [], "the mapping is released with the last tensor"


def test_context_manager_returns_the_archive(tmp_path):
    path = str(tmp_path / "c.tsar")
    tsar.save({"w": torch.ones(2)}, path)
    with tsar.open(path) as a:
        assert isinstance(a, tsar.Archive)
        assert a.keys() == ["w"]


def test_pathlike_is_accepted(tmp_path):
    path = tmp_path / "p.tsar"
    tsar.save({"w": torch.ones(2)}, path)
    with tsar.open(path) as a:
        assert torch.equal(a["w"], torch.ones(2))


@pytest.mark.parametrize("mode", ["shared", "copy_on_write", "read"])
def test_modes(tmp_path, mode):
    path = str(tmp_path / "m.tsar")
    want = torch.arange(5000, dtype=torch.float32)
    tsar.save({"w": want}, path)
    before = open(path, "rb").read()
    with tsar.open(path, mode=mode) as a:
        assert a.mode == mode
        w = a["w"]
        assert torch.equal(w, want)
        ranges = mapped_ranges(path)
        if mode == "read":
            assert not in_mapping(w.data_ptr(), ranges), "read mode copies into private memory"
        else:
            assert in_mapping(w.data_ptr(), ranges)
        if mode != "shared":
            w.add_(1)
            assert torch.equal(a["w"] if mode == "copy_on_write" else w, want + 1)
    assert open(path, "rb").read() == before


@pytest.mark.parametrize("prefetch", ["none", "willneed", "populate", "lock"])
def test_prefetch(tmp_path, prefetch):
    path = str(tmp_path / "p.tsar")
    want = torch.randn(100000, generator=torch.Generator().manual_seed(1))
    tsar.save({"w": want}, path)
    size = os.path.getsize(path)
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    can_lock = os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= size + (1 << 20)
    if prefetch == "lock" and not can_lock:
        with pytest.raises(tsar.Error) as ei:
            tsar.open(path, prefetch="lock")
        assert ei.value.code == tsar.ErrorCode.IO
        return
    with tsar.open(path, prefetch=prefetch) as a:
        assert torch.equal(a["w"], want)


@pytest.mark.parametrize("kwargs", [{"mode": "rw"}, {"mode": ""}, {"prefetch": "all"},
                                    {"verify": "none"}])
def test_bad_option_strings(tmp_path, kwargs):
    path = str(tmp_path / "o.tsar")
    tsar.save({"w": torch.ones(2)}, path)
    with pytest.raises(ValueError):
        tsar.open(path, **kwargs)


def test_error_attributes(tmp_path):
    path = str(tmp_path / "x.tsar")
    tsar.save({"w": torch.ones(2)}, path)
    with tsar.open(path) as a, pytest.raises(tsar.Error) as ei:
        a.tensor("missing")
    e = ei.value
    assert isinstance(e, RuntimeError)
    assert e.code == tsar.ErrorCode.NOT_FOUND and isinstance(e.code, tsar.ErrorCode)
    assert e.path == path and e.offset is None
    assert "missing" in str(e) and str(e).startswith(path + ": ")


FALLBACK = r"""
import sys, torch, tsar
a = tsar.open(sys.argv[1])
print(a.mode, float(a["w"].sum()), flush=True)
"""


def refuse_mmap_shim():
    """tests/loader/refuse_mmap_shim.c as built by the C++ tests (every file mmap fails with ENODEV)."""
    path = os.environ.get("TSAR_REFUSE_MMAP") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(tsar.__file__)))),
        "tests", "libtsar_refuse_mmap.so")
    if not os.path.isfile(path):
        pytest.skip(f"no mmap-refusing shim at {path} (built with the C++ tests; or set TSAR_REFUSE_MMAP)")
    return path


def test_falls_back_to_read_when_mmap_is_refused(tmp_path):
    shim = refuse_mmap_shim()
    path = str(tmp_path / "f.tsar")
    tsar.save({"w": torch.arange(10.0)}, path)
    env = child_env()
    env["LD_PRELOAD"] = shim
    r = subprocess.run([sys.executable, "-c", FALLBACK, path], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["read", "45.0"]
    assert path in r.stderr, f"the fallback warns on stderr naming the archive: {r.stderr!r}"


def test_a_bad_alignment_names_the_output_and_writes_nothing(tmp_path):
    path = tmp_path / "a.tsar"
    with pytest.raises(tsar.Error) as e:
        tsar.save({"w": torch.ones(4)}, path, alignment=100)
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert e.value.path == str(path)
    assert str(e.value) == f"{path}: alignment: expected a power of two in [64, 2^30], found 100"
    assert not path.exists()


@pytest.mark.hdf5
def test_import_tsar_loads_neither_hdf5_nor_the_pack_module():
    """A worker that only opens and binds never loads libhdf5 and the ~30
    libraries behind it (4.5 ms at every start): they live in tsar._tsar_pack
    (tsar._tsar_pack_portable on the portable path), loaded by the first
    tsar.pack."""
    import subprocess
    import sys

    code = ("import sys, tsar, torch\n"
            "def mapped(): return open('/proc/self/maps').read()\n"
            "def packer(): return any(m.startswith('tsar._tsar_pack') for m in sys.modules)\n"
            "print('libhdf5' in mapped(), packer())\n"
            "torch.save({'w': torch.ones(2)}, sys.argv[1] + '/w.pt')\n"
            "tsar.pack(sys.argv[1] + '/w.pt', sys.argv[1] + '/w.tsar')\n"
            "print('libhdf5' in mapped(), packer())\n")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True,
                             check=True).stdout.split("\n")
    assert out[0] == "False False"
    assert out[1] == "True True"
