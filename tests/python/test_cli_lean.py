"""Issue 13, first step: `tsar` itself links no LibTorch. inspect, verify, diff
and residency never load it; pack and export are parsed by tsar and run by
tsar-torch beside it, with the same command line, messages and exit codes."""
import os
import shutil
import subprocess

import torch

import tsar


def loaded_libraries(cli, *args):
    """The shared objects the dynamic loader opened for `cli args` (LD_DEBUG)."""
    env = dict(os.environ, LD_DEBUG="libs")
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, env=env)
    libs = {line.split("calling init: ")[1].strip() for line in r.stderr.splitlines() if "calling init: " in line}
    return r, libs


def is_torch(lib):
    name = os.path.basename(lib)
    return name.startswith(("libtorch", "libc10"))


def test_read_commands_never_load_libtorch(cli, tmp_path):
    torch.manual_seed(0)
    tsar.save({"w": torch.randn(4, 4)}, tmp_path / "a.tsar")
    tsar.save({"w": torch.randn(4, 4)}, tmp_path / "b.tsar")
    for args in [("inspect", tmp_path / "a.tsar"), ("inspect", "--json", tmp_path / "a.tsar"),
                 ("verify", tmp_path / "a.tsar"), ("diff", tmp_path / "a.tsar", tmp_path / "b.tsar"),
                 ("residency", tmp_path / "a.tsar"), ("--help",), ("--version",)]:
        r, libs = loaded_libraries(cli, *args)
        assert r.returncode in (0, 1), (args, r.stderr[-2000:])
        assert libs, f"LD_DEBUG reported no library for {args}"
        assert not [lib for lib in libs if is_torch(lib)], (args, sorted(libs))
    # pack runs in tsar-torch, which does load LibTorch.
    torch.save({"w": torch.randn(3)}, tmp_path / "sd.pt")
    r, libs = loaded_libraries(cli, "pack", "-q", tmp_path / "sd.pt", "-o", tmp_path / "c.tsar")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [lib for lib in libs if is_torch(lib)]
    with tsar.open(tmp_path / "c.tsar") as a:
        assert a["w"].shape == (3,)


def test_pack_and_export_keep_their_messages_and_exit_codes(cli, tmp_path):
    # Parsed by tsar: usage errors never reach tsar-torch.
    r = subprocess.run([cli, "pack", "x.pt", "--outptu", "y"], capture_output=True, text=True)
    assert r.returncode == 2 and "did you mean --output?" in r.stderr
    # Run by tsar-torch: its errors and exit codes come back unchanged.
    r = subprocess.run([cli, "pack", tmp_path / "missing.pt", "-o", tmp_path / "m.tsar"],
                       capture_output=True, text=True)
    assert r.returncode == 3 and "missing.pt: cannot open" in r.stderr
    tsar.save({"w": torch.ones(2)}, tmp_path / "m.tsar")
    r = subprocess.run([cli, "export", tmp_path / "m.tsar", "-o", tmp_path / "m.safetensors"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "exported 1 tensors" in r.stdout, r.stderr


def test_a_tsar_without_tsar_torch_says_what_is_missing(cli, tmp_path):
    lone = tmp_path / "bin" / "tsar"
    lone.parent.mkdir()
    shutil.copy(cli, lone)
    tsar.save({"w": torch.ones(2)}, tmp_path / "m.tsar")
    r = subprocess.run([lone, "inspect", tmp_path / "m.tsar"], capture_output=True, text=True)
    assert r.returncode == 0 and "1 tensors" in r.stdout
    r = subprocess.run([lone, "export", tmp_path / "m.tsar", "-o", tmp_path / "x.pt"],
                       capture_output=True, text=True)
    assert r.returncode == 3
    assert "tsar export runs in tsar-torch" in r.stderr and str(lone.parent / "tsar-torch") in r.stderr
    assert not (tmp_path / "x.pt").exists()
