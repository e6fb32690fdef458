"""Cross-language bytes: tsar.save, tsar.pack and the CLI's `tsar pack` write the
same bytes for the same tensors; saving is deterministic."""
import collections
import fractions
import os
import subprocess

import h5py
import numpy as np
import pytest
import torch

import tsar
from tsar_testutil import DTYPES, make_tensor, reference_decoder, same_tensor


def run_cli(cli, *args, expect=0):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode == expect, f"tsar {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr}"
    return r


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Net(torch.nn.Module):
    """Tied storage across roles (emb_t is a transposed view of emb.weight), views of
    one buffer, BatchNorm buffers (an int64 0-d one among them)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(300, 8)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 8))
        self.register_buffer("emb_t", self.emb.weight.detach().t())
        base = torch.arange(40.0)
        self.register_buffer("base", base)
        self.register_buffer("window", base[10:30].view(4, 5))

    def forward(self, ids):
        h = self.body(self.emb(ids).mean(1))
        return h @ self.emb_t + self.window.sum()


def net(seed=0):
    torch.manual_seed(seed)
    return Net().eval()


def test_state_dict_same_bytes_as_cli(tmp_path, cli):
    sd = net().state_dict()
    assert hasattr(sd, "_metadata")
    pt = tmp_path / "sd.pt"
    torch.save(sd, pt)
    a, b, c = tmp_path / "a.tsar", tmp_path / "b.tsar", tmp_path / "c.tsar"
    run_cli(cli, "pack", pt, "-o", a, "-q")
    tsar.save(sd, str(b))
    summary = tsar.pack(str(pt), str(c))
    assert read(a) == read(b), "tsar.save and `tsar pack` of torch.save differ"
    assert read(a) == read(c), "tsar.pack and `tsar pack` differ"
    assert summary.tensors == len(sd)
    assert summary.entries == ["model"]
    assert summary.notes == []
    distinct = {t.storage().data_ptr(): t.storage().nbytes() for t in sd.values()}
    assert 0 < summary.nbytes <= sum(distinct.values())
    with tsar.open(str(b)) as arch:
        meta = arch.metadata("model")
        assert "torch._metadata" in meta
        assert arch.info("emb.weight").storage == arch.info("emb_t").storage
        assert arch.info("base").storage == arch.info("window").storage
        for name, t in sd.items():
            assert same_tensor(arch[name], t) == "", name


def test_every_dtype_and_view_same_bytes_as_cli(tmp_path, cli):
    sd = {}
    for dtype in DTYPES:
        base = make_tensor(dtype, (6, 8), seed=1)
        sd[f"{dtype}.full"] = make_tensor(dtype, (5, 3), seed=2)
        sd[f"{dtype}.t"] = base.t()
        sd[f"{dtype}.slice"] = base[1:4, 2:7:2]
        sd[f"{dtype}.scalar"] = make_tensor(dtype, (), seed=3)
        sd[f"{dtype}.empty"] = make_tensor(dtype, (0, 4), seed=4)
    sd["param"] = torch.nn.Parameter(torch.ones(3))
    pt = tmp_path / "all.pt"
    # An OrderedDict, as state_dict() returns: what tsar.save's archive implies
    # (a plain dict would be kept as a dict, in a value tree: format 1.1).
    torch.save(collections.OrderedDict(sd), pt)
    a, b = tmp_path / "a.tsar", tmp_path / "b.tsar"
    run_cli(cli, "pack", pt, "-o", a, "-q", "--align", "64")
    tsar.save(sd, str(b), alignment=64)
    assert read(a) == read(b)
    with tsar.open(str(b)) as arch:
        assert arch.alignment == 64
        assert arch.info("param").role == "parameter"


def test_entries_and_metadata_same_bytes_as_cli(tmp_path, cli):
    sd1, sd2 = net(0).state_dict(), net(1).state_dict()
    pt = tmp_path / "ckpt.pt"
    # Keys of numbers and strings in sorted order, as metadata keeps them: then
    # entries and metadata imply this dict exactly, and no value tree is needed.
    torch.save({"model": sd1, "ema": sd2, "arch": "net", "lr": 0.5, "step": 1000}, pt)
    a, b, c = tmp_path / "a.tsar", tmp_path / "b.tsar", tmp_path / "c.tsar"
    run_cli(cli, "pack", pt, "-o", a, "-q")
    tsar.save({"model": sd1, "ema": sd2}, str(b), metadata={"step": 1000, "lr": 0.5, "arch": "net"})
    summary = tsar.pack(str(pt), str(c))
    assert read(a) == read(b)
    assert read(a) == read(c)
    assert summary.entries == ["model", "ema"] and summary.tensors == len(sd1) + len(sd2)
    with tsar.open(str(c)) as arch:
        assert arch.entries == ["model", "ema"]
        assert arch.metadata() == {"step": 1000, "lr": 0.5, "arch": "net"}
        for name, t in sd2.items():
            assert same_tensor(arch.tensor(name, entry="ema"), t) == "", name


def test_pack_list_and_dict_sources_same_bytes_as_cli(tmp_path, cli):
    sd1, sd2 = net(0).state_dict(), net(1).state_dict()
    p1, p2 = tmp_path / "one.pt", tmp_path / "two.pt"
    torch.save(sd1, p1)
    torch.save(sd2, p2)
    a, b = tmp_path / "a.tsar", tmp_path / "b.tsar"
    run_cli(cli, "pack", "--entry", f"model={p1}", "--entry", f"ema={p2}", "--meta", "step=7", "-o", a, "-q")
    summary = tsar.pack({"model": str(p1), "ema": str(p2)}, str(b), metadata={"step": 7})
    assert read(a) == read(b)
    assert summary.entries == ["model", "ema"]
    # A list: the second file names its own entry.
    p3 = tmp_path / "three.pt"
    torch.save({"ema": sd2}, p3)
    c, d = tmp_path / "c.tsar", tmp_path / "d.tsar"
    run_cli(cli, "pack", p1, p3, "-o", c, "-q")
    summary = tsar.pack([str(p1), str(p3)], str(d))
    assert read(c) == read(d)
    assert summary.entries == ["model", "ema"]
    # Two state_dicts that would both be entry "model" are refused.
    with pytest.raises(tsar.Error) as ei:
        tsar.pack([str(p1), str(p2)], str(tmp_path / "e.tsar"))
    assert ei.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert not os.path.exists(tmp_path / "e.tsar")


def test_pack_entry_and_alignment_same_bytes_as_cli(tmp_path, cli):
    sd = net().state_dict()
    pt = tmp_path / "sd.pt"
    torch.save(sd, pt)
    a, b, c = tmp_path / "a.tsar", tmp_path / "b.tsar", tmp_path / "c.tsar"
    run_cli(cli, "pack", "--entry", f"ckpt={pt}", "--align", "64", "-o", a, "-q")
    summary = tsar.pack(str(pt), str(b), entry="ckpt", alignment=64)
    tsar.save(sd, str(c), entry="ckpt", alignment=64)
    assert read(a) == read(b) == read(c)
    assert summary.entries == ["ckpt"]
    with tsar.open(str(b)) as arch:
        assert arch.entries == ["ckpt"] and arch.alignment == 64


def test_pack_checkpoints_and_strict(tmp_path, cli):
    sd = net().state_dict()
    pt = tmp_path / "mixed.pt"
    torch.save({"model": sd, "step": 3, "history": [1, 2, 3], "when": fractions.Fraction(1, 3)}, pt)
    a, b = tmp_path / "a.tsar", tmp_path / "b.tsar"
    r = run_cli(cli, "pack", pt, "-o", a)
    summary = tsar.pack(str(pt), str(b))
    assert read(a) == read(b)
    assert summary.notes == [] and "note:" not in r.stderr  # nothing is skipped any more
    assert read(a)[10:12] == b"\x01\x00"  # format 1.1: the list and the Fraction need the tree
    # strict refuses what would be an opaque pickle fragment (the Fraction).
    with pytest.raises(tsar.Error) as ei:
        tsar.pack(str(pt), str(tmp_path / "strict.tsar"), strict=True)
    assert ei.value.code == tsar.ErrorCode.BAD_INPUT and "fractions.Fraction" in str(ei.value)
    run_cli(cli, "pack", "--strict", pt, "-o", tmp_path / "strict2.tsar", expect=3)
    assert not os.path.exists(tmp_path / "strict.tsar")
    # Packed with another file, a checkpoint that needs a tree is refused.
    other = tmp_path / "other.pt"
    torch.save(net(1).state_dict(), other)
    with pytest.raises(tsar.Error) as ei:
        tsar.pack({"ema": str(other), "ckpt": str(pt)}, str(tmp_path / "two.tsar"))
    assert ei.value.code == tsar.ErrorCode.INVALID_ARGUMENT and "on its own" in str(ei.value)


@pytest.mark.tsar_torch
def test_torchscript_same_bytes_as_cli(tmp_path, cli):
    m = net()
    ts = tmp_path / "net_ts.pt"
    torch.jit.save(torch.jit.script(m), str(ts))
    a, b = tmp_path / "a.tsar", tmp_path / "b.tsar"
    run_cli(cli, "pack", ts, "-o", a, "-q")
    summary = tsar.pack(str(ts), str(b))
    assert read(a) == read(b)
    sd = m.state_dict(keep_vars=True)
    assert summary.tensors == len(sd)
    params = dict(m.named_parameters())
    with tsar.open(str(b)) as arch:
        assert arch.keys() == list(sd)
        for name, t in sd.items():
            assert arch.info(name).role == ("parameter" if name in params else "buffer"), name
            assert torch.equal(arch[name].detach(), t.detach()), name
        # A fresh model bound to it computes what the original does.
        fresh = net(seed=5)
        tsar.load_into(fresh, arch)
        ids = torch.tensor([[1, 2, 299]])
        with torch.no_grad():
            assert torch.equal(fresh(ids), m(ids))


@pytest.mark.hdf5
def test_hdf5_same_bytes_as_cli(tmp_path, cli):
    h5 = tmp_path / "w.h5"
    rng = np.random.default_rng(0)
    want = {"layer1.weight": rng.standard_normal((4, 3)).astype(np.float32),
            "layer1.bias": rng.standard_normal(4).astype(np.float64),
            "counts": np.arange(10, dtype=np.int64)}
    with h5py.File(h5, "w") as f:
        f.attrs["epoch"] = 3
        f.attrs["arch"] = "mlp"
        g = f.create_group("layer1")
        g.create_dataset("weight", data=want["layer1.weight"])
        g.create_dataset("bias", data=want["layer1.bias"])
        f.create_dataset("counts", data=want["counts"])
    a, b = tmp_path / "a.tsar", tmp_path / "b.tsar"
    run_cli(cli, "pack", h5, "-o", a, "-q")
    summary = tsar.pack(str(h5), str(b))
    assert read(a) == read(b)
    assert summary.tensors == 3
    with tsar.open(str(b)) as arch:
        assert sorted(arch.keys()) == sorted(want)
        for name, arr in want.items():
            assert torch.equal(arch[name], torch.from_numpy(arr)), name
        assert arch.metadata() == {"epoch": 3, "arch": "mlp"}


def test_saving_is_deterministic(tmp_path):
    sd = net().state_dict()
    paths = [str(tmp_path / f"{i}.tsar") for i in range(3)]
    tsar.save(sd, paths[0], metadata={"k": "v", "a": 1})
    tsar.save(sd, paths[1], metadata={"a": 1, "k": "v"})   # metadata order does not matter
    tsar.save(net(), paths[2])                               # a Module: roles differ, still valid
    assert read(paths[0]) == read(paths[1])
    ref = reference_decoder()
    for p in paths:
        ref.decode(read(p), p)
    assert read(paths[2]) != read(paths[0])


def test_saving_is_atomic_and_read_only(tmp_path):
    path = tmp_path / "ro.tsar"
    tsar.save({"w": torch.ones(2)}, str(path))
    mode = os.stat(path).st_mode & 0o777
    assert mode & 0o222 == 0, f"archives are published read-only, got {oct(mode)}"
    tsar.save({"w": torch.zeros(3)}, str(path))  # replaced by rename, not rewritten
    with tsar.open(str(path)) as a:
        assert torch.equal(a["w"], torch.zeros(3))
    assert sorted(os.listdir(tmp_path)) == ["ro.tsar"], "no temporary file is left behind"


@pytest.mark.tsar_torch
def test_every_dtype_exports_back_exactly(tmp_path, cli):
    """torch.save of torch 2.x (float8 and uint16-64 as _rebuild_tensor_v3) ->
    tsar pack -> export .pt -> torch.load(weights_only=True), and -> export
    .safetensors -> the safetensors library: every dtype and bit back."""
    from safetensors.torch import load_file, save_file

    sd = {f"{dtype}": make_tensor(dtype, (4, 6), seed=7) for dtype in DTYPES}
    sd.update({f"{dtype}.t": make_tensor(dtype, (3, 5), seed=8).t() for dtype in DTYPES})
    pt = tmp_path / "all.pt"
    torch.save(sd, pt)
    run_cli(cli, "pack", pt, "-o", tmp_path / "a.tsar", "-q")
    run_cli(cli, "export", tmp_path / "a.tsar", "-o", tmp_path / "back.pt", "-q")
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    mapped = torch.load(tmp_path / "back.pt", weights_only=True, mmap=True)  # records 64-aligned
    assert list(back) == list(sd) == list(mapped)
    for name, t in sd.items():
        assert same_tensor(back[name], t) == "", name
        assert same_tensor(mapped[name], t) == "", name
        assert mapped[name].data_ptr() % 64 == 0 or mapped[name].numel() == 0, name

    # The safetensors library's own file, with its dtype names (F8_E4M3, U16...).
    flat = {k: v.contiguous() for k, v in sd.items() if not v.is_complex()}  # none in safetensors
    save_file(flat, str(tmp_path / "lib.safetensors"))
    run_cli(cli, "pack", tmp_path / "lib.safetensors", "-o", tmp_path / "s.tsar", "-q")
    run_cli(cli, "export", tmp_path / "s.tsar", "-o", tmp_path / "back.safetensors", "-q")
    for path in (tmp_path / "back.safetensors",):
        got = load_file(str(path))
        assert set(got) == set(flat)
        for name, t in flat.items():
            assert same_tensor(got[name], t) == "", name
    with tsar.open(str(tmp_path / "s.tsar")) as arch:
        for name, t in flat.items():
            assert same_tensor(arch[name], t) == "", name
