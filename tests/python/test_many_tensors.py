"""100,000 tensors through every command (issue 11): files made here, as
mixture-of-experts checkpoints look (experts x layers, small tensors), packed
from safetensors (single and sharded), torch.save and HDF5, then inspected,
verified, compared, exported to every format and read back, opened and bound.
Nothing here is timed (bench/p12_scale.py measures the scaling); what is
checked is that every command handles that many tensors and gets every one
right. TorchScript gets 10,000 buffers: LibTorch's own torch::jit::load is
quadratic in the attributes of one module (17 s for 100,000)."""
import collections
import json
import struct
import subprocess

import h5py
import numpy as np
import pytest
import torch

import tsar
from tsar import _build_info

N = 100_000


def name(i):
    return f"layers.{i // 1000}.experts.{i % 1000}.w"


def value(i):
    return np.full(4, i, dtype=np.float32)


def write_safetensors(path, indices):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for i in indices:
        header[name(i)] = {"dtype": "F32", "shape": [4], "data_offsets": [offset, offset + 16]}
        offset += 16
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    data = np.repeat(np.asarray(indices, dtype=np.float32), 4).tobytes()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("many")
    write_safetensors(d / "many.safetensors", range(N))
    shards = [range(k, min(k + 30_000, N)) for k in range(0, N, 30_000)]
    weight_map = {}
    for s, indices in enumerate(shards):
        shard = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(d / shard, indices)
        weight_map.update({name(i): shard for i in indices})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    sd = collections.OrderedDict((name(i), torch.from_numpy(value(i))) for i in range(N))
    torch.save(sd, d / "many.pt")
    # h5py's low-level calls: the same contiguous float32 datasets as
    # create_dataset, in 7 s instead of 20.
    with h5py.File(d / "many.h5", "w") as f:
        space = h5py.h5s.create_simple((4,))
        for i in range(N):
            h5py.h5d.create(f.id, name(i).encode(), h5py.h5t.IEEE_F32LE, space).write(
                h5py.h5s.ALL, h5py.h5s.ALL, value(i))
    with h5py.File(d / "many.h5", "r") as f:  # as create_dataset writes them
        for i in (0, N - 1):
            assert f[name(i)].dtype == np.float32 and f[name(i)].shape == (4,)
            assert np.array_equal(f[name(i)][()], value(i))
    return d


def run(cli, *args):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


def check_archive(path, names=None):
    with tsar.open(path) as a:
        sd = a.state_dict()
        assert len(sd) == N
        want = names or [name(i) for i in range(N)]
        assert list(sd.keys()) == want
        for i in (0, 1, 999, 1000, 54_321, N - 1):
            assert torch.equal(sd[name(i)], torch.from_numpy(value(i)))


@pytest.fixture(scope="module")
def packed(cli, corpus):
    out = {}
    kinds = [("safetensors", "many.safetensors"), ("sharded", "model.safetensors.index.json"),
             ("pt", "many.pt")] + ([("h5", "many.h5")] if _build_info.hdf5 else [])
    for kind, src in kinds:
        out[kind] = corpus / f"{kind}.tsar"
        run(cli, "pack", corpus / src, "-o", out[kind])
    return out


@pytest.mark.hdf5
def test_every_input_packs_every_tensor(packed):
    for kind in ("safetensors", "sharded", "pt"):
        check_archive(packed[kind])
    # HDF5 groups list their members by name, not in creation order.
    check_archive(packed["h5"], sorted(name(i) for i in range(N)))


def test_inspect_verify_diff_residency(cli, packed):
    doc = json.loads(run(cli, "inspect", "--json", packed["pt"]))
    assert len(doc["tensors"]) == N and len(doc["storages"]) == N
    text = run(cli, "inspect", packed["safetensors"])
    assert text.count("layers.") >= N
    run(cli, "verify", packed["sharded"])
    diff = json.loads(run(cli, "diff", "--json", packed["safetensors"], packed["sharded"]))
    assert diff["equal"] and not diff["changed"]
    res = json.loads(run(cli, "residency", "--json", packed["pt"]))
    assert res["pages"] > 0


@pytest.mark.hdf5
@pytest.mark.parametrize("ext", [pytest.param("pt", marks=pytest.mark.tsar_torch),
                                 "safetensors", "h5"])
def test_export_and_read_back(cli, packed, corpus, ext):
    out = corpus / f"back.{ext}"
    run(cli, "export", packed["safetensors"], "-o", out)
    again = corpus / f"again_{ext}.tsar"
    run(cli, "pack", out, "-o", again)
    check_archive(again, sorted(name(i) for i in range(N)) if ext == "h5" else None)


def test_load_into_binds_every_buffer(packed):
    module = torch.nn.Module()
    for i in range(N):
        module.register_buffer(f"b{i}", torch.empty(4))
    module.eval()
    # The same values under the module's flat names (buffer names hold no dots).
    with tsar.open(packed["pt"]) as a:
        sd = a.state_dict()
    flat = collections.OrderedDict((f"b{i}", t) for i, t in enumerate(sd.values()))
    path = packed["pt"].parent / "flat.tsar"
    tsar.save(flat, path)
    with tsar.open(path) as a:
        report = tsar.load_into(module, a)
    assert len(report.bound) == N and not report.missing and not report.unexpected
    assert torch.equal(module.b54321, torch.from_numpy(value(54_321)))


@pytest.mark.tsar_torch
def test_torchscript_with_10000_buffers(cli, tmp_path):
    class Many(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for i in range(10_000):
                self.register_buffer(f"b{i}", torch.full((2,), float(i)))

        def forward(self, x):
            return x

    src = tmp_path / "ts.pt"
    torch.jit.script(Many()).save(str(src))
    out = tmp_path / "ts.tsar"
    run(cli, "pack", src, "-o", out)
    with tsar.open(out) as a:
        assert len(a.keys()) == 10_000 and torch.equal(a.tensor("b9999"), torch.full((2,), 9999.0))
