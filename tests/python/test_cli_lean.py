"""Issue 13: `tsar` links no LibTorch. inspect, verify, diff, residency, pack
from torch.save, safetensors and HDF5, and export to safetensors and HDF5 run
in it and never load LibTorch; only a TorchScript input, --arch and export to
.pt go to tsar-torch, with the same command line, messages and exit codes. Both
executables write the same bytes for the same input."""
import hashlib
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest
import torch

import tsar
from tsar_testutil import bits, write_safetensors


def loaded_libraries(cli, *args):
    """The shared objects the dynamic loader opened for `cli args` (LD_DEBUG)."""
    env = dict(os.environ, LD_DEBUG="libs")
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, env=env)
    libs = {line.split("calling init: ")[1].strip() for line in r.stderr.splitlines() if "calling init: " in line}
    return r, libs


def is_torch(lib):
    return os.path.basename(lib).startswith(("libtorch", "libc10"))


def torch_side(cli):
    return os.path.join(os.path.dirname(cli), "tsar-torch")


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture()
def inputs(tmp_path):
    """A torch.save state_dict (views, tied weights, several dtypes), a
    checkpoint with optimizer state, a safetensors file and an HDF5 file."""
    torch.manual_seed(0)
    w = torch.randn(16, 8)
    torch.save({"a.weight": w, "b.weight": w, "a.t": w.t(), "h": torch.randn(9).half(),
                "bf": torch.randn(3, 3).bfloat16(), "i": torch.arange(4), "m": torch.rand(5) > 0.5,
                "d": torch.randn(6, dtype=torch.float64), "p": torch.nn.Parameter(torch.randn(4)),
                "e": torch.ones(3).expand(4, 3)}, tmp_path / "sd.pt")
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3},
               tmp_path / "ckpt.pt")
    write_safetensors(tmp_path / "m.safetensors",
                      {"x": ("F32", [4, 4], np.arange(16, dtype="<f4").tobytes()),
                       "y": ("I64", [2], np.arange(2, dtype="<i8").tobytes())}, metadata={"format": "pt"})
    with h5py.File(tmp_path / "m.h5", "w") as f:
        f["layer/weight"] = np.arange(12, dtype="f4").reshape(3, 4)
        f.create_dataset("chunked", data=np.arange(100, dtype="i4"), chunks=(10,), compression="gzip")
    return tmp_path


@pytest.mark.hdf5
def test_pack_export_and_read_commands_never_load_libtorch(cli, inputs):
    d = inputs
    runs = [("pack", "-q", d / "sd.pt", "-o", d / "sd.tsar"),
            ("pack", "-q", d / "ckpt.pt", "-o", d / "ckpt.tsar"),
            ("pack", "-q", d / "m.safetensors", "-o", d / "st.tsar"),
            ("pack", "-q", d / "m.h5", "--dtype", "float16", "-o", d / "h5.tsar"),
            ("pack", "-q", "--entry", f"a={d / 'sd.pt'}", "--entry", f"b={d / 'm.h5'}", "-o", d / "ab.tsar"),
            ("inspect", d / "sd.tsar"), ("inspect", "--json", d / "ckpt.tsar"), ("verify", d / "st.tsar"),
            ("diff", d / "sd.tsar", d / "ab.tsar"), ("residency", d / "sd.tsar"),
            ("export", "-q", d / "st.tsar", "-o", d / "back.safetensors"),
            ("export", "-q", d / "h5.tsar", "-o", d / "back.h5"), ("--help",), ("--version",)]
    for args in runs:
        r, libs = loaded_libraries(cli, *args)
        assert r.returncode in (0, 1), (args, r.stderr[-2000:])
        assert libs, f"LD_DEBUG reported no library for {args}"
        assert not [lib for lib in libs if is_torch(lib)], (args, sorted(libs))
    with tsar.open(d / "sd.tsar") as a:
        want = torch.load(d / "sd.pt")
        assert set(a.keys()) == set(want)
        for name, t in want.items():
            assert torch.equal(bits(a[name]), bits(t)), name
    with h5py.File(d / "back.h5") as f:
        assert f["layer/weight"].dtype == np.float16
        assert np.array_equal(f["chunked"][:], np.arange(100, dtype="i4"))
    with tsar.open(d / "ckpt.tsar") as a:
        for name, t in torch.load(d / "ckpt.pt")["model"].items():
            assert torch.equal(a.tensor(name, "model"), t), name


@pytest.mark.tsar_torch
def test_torchscript_arch_and_pt_export_go_to_tsar_torch(cli, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    torch.jit.save(torch.jit.script(model), tmp_path / "m_ts.pt")
    for args in [("pack", "-q", tmp_path / "m_ts.pt", "-o", tmp_path / "ts.tsar"),
                 ("pack", "-q", tmp_path / "m_ts.pt", "--arch", tmp_path / "arch.pt", "-o", tmp_path / "ts2.tsar"),
                 ("export", "-q", tmp_path / "ts.tsar", "-o", tmp_path / "back.pt")]:
        r, libs = loaded_libraries(cli, *args)
        assert r.returncode == 0, (args, r.stderr[-2000:])
        assert [lib for lib in libs if is_torch(lib)], args
    back = torch.load(tmp_path / "back.pt")
    assert torch.equal(back["0.weight"], model[0].weight.detach())
    assert sha(tmp_path / "ts.tsar") == sha(tmp_path / "ts2.tsar")
    # A TorchScript input among others is found before anything is imported.
    torch.save({"w": torch.ones(2)}, tmp_path / "sd.pt")
    r = subprocess.run([cli, "pack", "-q", "--entry", f"a={tmp_path / 'sd.pt'}", "--entry",
                        f"b={tmp_path / 'm_ts.pt'}", "-o", tmp_path / "two.tsar"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert set(tsar.open(tmp_path / "two.tsar").entries) == {"a", "b"}


@pytest.mark.hdf5
@pytest.mark.tsar_torch
def test_both_executables_write_the_same_bytes(cli, inputs):
    """The same PackFiles and exporters run in tsar (no LibTorch) and in
    tsar-torch; what they write must not depend on which one ran."""
    d = inputs
    for src in ["sd.pt", "ckpt.pt", "m.safetensors", "m.h5"]:
        for dtype in [[], ["--dtype", "bfloat16"], ["--dtype", "float16"], ["--dtype", "float32"]]:
            outs = []
            for exe in [cli, torch_side(cli)]:
                out = d / f"{src}.{os.path.basename(exe)}.tsar"
                r = subprocess.run([exe, "pack", "-q", *dtype, d / src, "-o", out], capture_output=True, text=True)
                assert r.returncode == 0, (exe, src, dtype, r.stderr)
                outs.append(sha(out))
                r = subprocess.run([exe, "export", "-q", "--materialize-shared", out, "-o", f"{out}.safetensors"],
                                   capture_output=True, text=True)
                assert r.returncode == 0, (exe, r.stderr)
                outs.append(sha(f"{out}.safetensors"))
            assert outs[:2] == outs[2:], (src, dtype)


def test_dtype_conversion_rounds_as_libtorch(cli, tmp_path):
    """--dtype converts without LibTorch, element for element as torch's .to()
    (round to nearest, ties to even; float64 through float32), over normal,
    subnormal, overflowing and tie values. NaN: float16 keeps the sign with
    0x7E00, bfloat16 is 0x7FC0 (LibTorch's scalar rule; its vectorized loop
    gives 0xFFFF instead, so its own result depends on where the NaN lies)."""
    torch.manual_seed(0)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 65504.0, 65519.99, 65520.0, -65520.0,
                            6.1e-5, 6.0e-8, 5.96e-8, 2.98e-8, 2.99e-8, 1e-40, -1e-45, 3.4e38, 1 + 2 ** -11,
                            1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8])
    f32 = torch.cat([torch.randn(50000) * 1000, torch.randn(50000) * 1e-6, special])
    # Every float16 and bfloat16 bit pattern but NaN, and float32 halfway points between them.
    halves = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    halves = halves[~torch.isnan(halves)]
    bfs = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    bfs = bfs[~torch.isnan(bfs)]
    mids = (halves.float()[:-1] + halves.float()[1:]) / 2
    sd = {"f32": f32, "f64": f32.double() * (1 + 2 ** -30), "f16": halves, "bf16": bfs, "mid": mids}
    torch.save(sd, tmp_path / "v.pt")
    for dtype in [torch.float16, torch.bfloat16, torch.float32]:
        name = str(dtype).split(".")[1]
        r = subprocess.run([cli, "pack", "-q", "--dtype", name, tmp_path / "v.pt", "-o", tmp_path / f"{name}.tsar"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        with tsar.open(tmp_path / f"{name}.tsar") as a:
            for key, t in sd.items():
                want = t.to(dtype) if t.dtype != dtype else t
                finite = ~torch.isnan(want)
                assert torch.equal(bits(a[key])[finite], bits(want)[finite]), (key, name)
    nan = torch.tensor([float("nan"), -float("nan")] * 20)
    torch.save({"n": nan}, tmp_path / "nan.pt")
    for name, want in [("float16", [0x7E00, -512]), ("bfloat16", [0x7FC0, 0x7FC0])]:
        subprocess.run([cli, "pack", "-q", "--dtype", name, tmp_path / "nan.pt", "-o", tmp_path / "n.tsar"], check=True)
        with tsar.open(tmp_path / "n.tsar") as a:
            assert bits(a["n"]).tolist() == want * 20, name


def test_pack_and_export_keep_their_messages_and_exit_codes(cli, tmp_path):
    r = subprocess.run([cli, "pack", "x.pt", "--outptu", "y"], capture_output=True, text=True)
    assert r.returncode == 2 and "did you mean --output?" in r.stderr
    r = subprocess.run([cli, "pack", tmp_path / "missing.pt", "-o", tmp_path / "m.tsar"],
                       capture_output=True, text=True)
    assert r.returncode == 3 and "missing.pt: cannot open" in r.stderr
    tsar.save({"w": torch.ones(2)}, tmp_path / "m.tsar")
    r = subprocess.run([cli, "export", tmp_path / "m.tsar", "-o", tmp_path / "m.safetensors"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "exported 1 tensors" in r.stdout, r.stderr


def test_a_tsar_without_tsar_torch_packs_and_says_what_is_missing(cli, tmp_path):
    lone = tmp_path / "bin" / "tsar"
    lone.parent.mkdir()
    shutil.copy(cli, lone)
    torch.save({"w": torch.ones(2)}, tmp_path / "sd.pt")
    r = subprocess.run([lone, "pack", tmp_path / "sd.pt", "-o", tmp_path / "m.tsar"], capture_output=True, text=True)
    assert r.returncode == 0 and "packed 1 tensors" in r.stdout, r.stderr
    r = subprocess.run([lone, "export", tmp_path / "m.tsar", "-o", tmp_path / "x.safetensors"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([lone, "export", tmp_path / "m.tsar", "-o", tmp_path / "x.pt"], capture_output=True, text=True)
    assert r.returncode == 3
    assert "tsar export: writing a torch.save file runs in tsar-torch" in r.stderr
    assert str(lone.parent / "tsar-torch") in r.stderr
    assert not (tmp_path / "x.pt").exists()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "ts.pt")
    r = subprocess.run([lone, "pack", tmp_path / "ts.pt", "-o", tmp_path / "ts.tsar"], capture_output=True, text=True)
    assert r.returncode == 3
    assert f"{tmp_path / 'ts.pt'} is a TorchScript archive: reading it runs in tsar-torch" in r.stderr
    assert not (tmp_path / "ts.tsar").exists()
