"""Memory stays bounded (issue 16, item 5): exporting an expanded view that is
1 GiB contiguous, packing a 192 MiB HDF5 file and reading a torch.save zip
whose data.pkl claims gigabytes all run in tens of MB of anonymous memory.

Peak anonymous memory is sampled from /proc/PID/status (RssAnon) while the
command runs; what the command maps from files (LibTorch, the input) is not
anonymous and not counted. The bound is against the same command's baseline on a
tiny input, so the cost of loading LibTorch cancels out."""
import struct
import subprocess
import time
import zipfile

import h5py
import numpy as np
import pytest
import torch

import tsar

MIB = 1 << 20


def peak_anon(cmd):
    """Runs `cmd`; returns (returncode, stderr, peak RssAnon in bytes)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.002)
    _, err = p.communicate()
    return p.returncode, err, peak


@pytest.fixture(scope="module")
def baseline(cli, tmp_path_factory):
    d = tmp_path_factory.mktemp("baseline")
    tsar.save({"x": torch.ones(4)}, d / "tiny.tsar")
    rc, err, peak = peak_anon([cli, "export", str(d / "tiny.tsar"), "-o", str(d / "tiny.safetensors")])
    assert rc == 0, err
    return peak


@pytest.mark.hdf5
@pytest.mark.parametrize("ext", ["safetensors", "h5"])
def test_export_of_an_expanded_view_streams(cli, tmp_path, baseline, ext):
    src = tmp_path / "expanded.tsar"
    x = torch.arange(4, dtype=torch.float32).reshape(4, 1).expand(4, 2**26)  # 1 GiB contiguous
    tsar.save({"x": x, "t": torch.arange(6.0).reshape(2, 3).t()}, src)
    assert src.stat().st_size < 64 * 1024
    out = tmp_path / f"out.{ext}"
    rc, err, peak = peak_anon([cli, "export", str(src), "-o", str(out)])
    assert rc == 0, err
    assert peak - baseline < 96 * MIB, f"peak anonymous memory {peak / MIB:.0f} MiB"
    if ext == "h5":
        with h5py.File(out, "r") as f:
            got_x = f["x"]
            assert got_x.shape == (4, 2**26)
            for row in range(4):
                assert (got_x[row, :: 2**20] == row).all() and got_x[row, -1] == row
            assert (f["t"][()] == x.new_tensor([[0, 3], [1, 4], [2, 5]]).numpy()).all()
    else:
        with open(out, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            import json

            header = json.loads(f.read(n))
            begin, end = header["x"]["data_offsets"]
            assert end - begin == 4 * 2**28
            for row in range(4):
                f.seek(8 + n + begin + row * 4 * 2**26)
                assert (np.frombuffer(f.read(4 * 4096), dtype=np.float32) == row).all()
            b, e = header["t"]["data_offsets"]
            f.seek(8 + n + b)
            assert np.frombuffer(f.read(e - b), dtype=np.float32).tolist() == [0, 3, 1, 4, 2, 5]


@pytest.mark.hdf5
def test_hdf5_pack_maps_contiguous_datasets(cli, tmp_path, baseline):
    src = tmp_path / "big.h5"
    data = np.arange(48 * MIB, dtype=np.float32)  # 192 MiB, contiguous (h5py's default)
    with h5py.File(src, "w") as f:
        f["w"] = data
        f.create_dataset("c", data=np.arange(1000, dtype=np.int64), chunks=(100,), compression="gzip")
    out = tmp_path / "big.tsar"
    rc, err, peak = peak_anon([cli, "pack", str(src), "-o", str(out)])
    assert rc == 0, err
    assert peak - baseline < 64 * MIB, f"peak anonymous memory {peak / MIB:.0f} MiB"
    with tsar.open(out) as a:
        assert torch.equal(a.tensor("w"), torch.from_numpy(data))
        assert torch.equal(a.tensor("c"), torch.arange(1000))


def test_zip_bomb_data_pkl_is_refused_before_inflating(cli, tmp_path, baseline):
    src = tmp_path / "bomb.pt"
    torch.save({"x": torch.ones(2)}, src)
    # Rewrite the zip with a deflated data.pkl padded to 300 MiB of zeros: a few
    # hundred KB on disk, past the reader's cap once inflated.
    with zipfile.ZipFile(src) as z:
        records = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(src, "w") as z:
        for name, data in records:
            if name.endswith("/data.pkl"):
                z.writestr(name, data + bytes(300 * MIB), compress_type=zipfile.ZIP_DEFLATED)
            else:
                z.writestr(name, data)
    assert src.stat().st_size < 2 * MIB
    rc, err, peak = peak_anon([cli, "pack", str(src), "-o", str(tmp_path / "bomb.tsar")])
    assert rc == 3, err
    assert "data.pkl" in err and "inflates to 314572" in err and "more than the 268435456" in err, err
    assert peak - baseline < 32 * MIB
    assert not (tmp_path / "bomb.tsar").exists()
