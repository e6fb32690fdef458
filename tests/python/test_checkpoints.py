"""Real training checkpoints (issue 10): any torch.save file packs, nothing in it
is run, and `tsar export -o back.pt` gives back an object equal to the original
piece by piece: the same nesting of dicts (key order and OrderedDict kept),
lists and tuples; bool, None, int of any size, float, str, bytes with their
types; tensors equal in dtype, shape, strides and bits, sharing storages as the
original did; objects tsar does not interpret (Namespace, numpy, Path, a
pickled module) restored from their opaque pickle fragments."""
import argparse
import collections
import math
import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch

from tsar_testutil import same_tensor


def deep_diff(got, want, where="root", storages=None):
    """'' when `got` equals `want` as described above, else where they differ.
    `storages` maps each original storage to the exported one, so that
    sharing must be the same in both directions."""
    if storages is None:
        storages = {}
    if type(got) is not type(want):
        return f"{where}: type {type(got).__name__} vs {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        why = same_tensor(got, want)
        if why:
            return f"{where}: {why}"
        if got.requires_grad != want.requires_grad:
            return f"{where}: requires_grad {got.requires_grad} vs {want.requires_grad}"
        if got.storage_offset() != want.storage_offset():
            return f"{where}: storage_offset {got.storage_offset()} vs {want.storage_offset()}"
        w, g = want.storage().data_ptr(), got.storage().data_ptr()
        if storages.setdefault(("w", w), g) != g or storages.setdefault(("g", g), w) != w:
            return f"{where}: storage sharing differs"
        return ""
    if isinstance(want, dict):
        if list(got.keys()) != list(want.keys()):
            return f"{where}: keys {list(got.keys())[:8]} vs {list(want.keys())[:8]}"
        if getattr(got, "_metadata", None) != getattr(want, "_metadata", None):
            return f"{where}: _metadata differs"
        for k in want:
            d = deep_diff(got[k], want[k], f"{where}[{k!r}]", storages)
            if d:
                return d
        return ""
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{where}: length {len(got)} vs {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            d = deep_diff(g, w, f"{where}[{i}]", storages)
            if d:
                return d
        return ""
    if isinstance(want, float):
        same = got == want or (math.isnan(got) and math.isnan(want))
        return "" if same and math.copysign(1, got) == math.copysign(1, want) else \
            f"{where}: {got!r} vs {want!r}"
    if isinstance(want, np.ndarray):
        ok = got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
        return "" if ok else f"{where}: array differs"
    if isinstance(want, torch.nn.Module):
        return deep_diff(got.state_dict(), want.state_dict(), where + ".state_dict()", storages)
    if isinstance(want, argparse.Namespace):
        return deep_diff(vars(got), vars(want), where + ".vars", storages)
    return "" if got == want else f"{where}: {got!r} vs {want!r}"


def roundtrip(cli, tmp_path, obj, name="ckpt"):
    src, arc, back = (tmp_path / f"{name}.pt", tmp_path / f"{name}.tsar",
                      tmp_path / f"{name}.back.pt")
    torch.save(obj, src)
    subprocess.run([cli, "pack", str(src), "-o", str(arc)], check=True, capture_output=True)
    subprocess.run([cli, "export", str(arc), "-o", str(back)], check=True, capture_output=True)
    return torch.load(src, weights_only=False), torch.load(back, weights_only=False), arc  # the test's own files


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2))


def train(m, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g)
        loss = m(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.Adam(p, lr=1e-3, betas=(0.8, 0.99), weight_decay=0.01),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
], ids=["adam", "sgd-momentum"])
@pytest.mark.tsar_torch
def test_training_resumes_bit_identically_from_an_export(cli, tmp_path, make_opt):
    m = model()
    opt = make_opt(m.parameters())
    train(m, opt, 3, seed=1)
    ckpt = {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "lr": 0.1}
    orig, back, _ = roundtrip(cli, tmp_path, ckpt)
    assert deep_diff(back, orig) == ""

    def resume(c):
        m2 = model()
        m2.load_state_dict(c["model"])
        o2 = make_opt(m2.parameters())
        o2.load_state_dict(c["optimizer"])
        train(m2, o2, 1, seed=2)
        return m2.state_dict()

    a, b = resume(orig), resume(back)
    assert list(a) == list(b)
    for k in a:
        assert same_tensor(b[k], a[k]) == "", k


@pytest.mark.tsar_torch
def test_everything_a_checkpoint_holds_comes_back_with_its_type(cli, tmp_path):
    m = model()
    shared = torch.arange(10.0)
    obj = {
        "model": m.state_dict(),
        "args": argparse.Namespace(lr=0.1, name="run", layers=[1, 2]),
        "np_scalar": np.float64(2.5),
        "np_int": np.int64(7),
        "np_array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "path": pathlib.PosixPath("/data/run1"),
        "rng": torch.get_rng_state(),
        "nested": [1, (2, 3.5, None), {"a": [True, False]}, b"raw\x00bytes", "text"],
        "flags": (True, False, None),
        "big": 99999999999999999999,
        "negbig": -(2**100) + 1,
        "int64_edge": [2**63 - 1, -2**63],
        "floats": [float("nan"), float("inf"), -0.0, 1e-310],
        "int_keys": {0: "zero", 1: "one", -5: "minus"},
        "mixed_keys": {1: "i", "1": "s", (1, 2): "t", None: "n", 2.5: "f", True: "b"},
        "ordered": collections.OrderedDict([("z", 1), ("a", 2)]),
        "empty": {"d": {}, "l": [], "t": (), "s": ""},
        "tensors": {"view": shared[2:5], "same": shared, "t": shared.view(2, 5).t()},
        "loose": shared,
        "set": {1, 2, 3},
        "frozen": frozenset({"x"}),
        "complex": 1 + 2j,
        "dtype": torch.float16,
        "size": torch.Size([2, 3]),
        "module": torch.nn.Linear(3, 2),
    }
    orig, back, _ = roundtrip(cli, tmp_path, obj)
    assert deep_diff(back, orig) == ""
    # The module's parameters are archive tensors like any other.
    assert isinstance(back["module"].weight, torch.nn.Parameter)
    assert back["tensors"]["same"].storage().data_ptr() == back["loose"].storage().data_ptr()


@pytest.mark.tsar_torch
def test_tensors_shared_between_model_and_optimizer_stay_shared(cli, tmp_path):
    w = torch.randn(3, 3)
    ckpt = {"model": collections.OrderedDict(w=w), "optimizer": {"state": {0: {"buf": w}}},
            "same_object_twice": [w, w]}
    orig, back, _ = roundtrip(cli, tmp_path, ckpt)
    assert deep_diff(back, orig) == ""
    assert back["same_object_twice"][0] is back["same_object_twice"][1]
    assert back["model"]["w"].storage().data_ptr() == \
        back["optimizer"]["state"][0]["buf"].storage().data_ptr()


@pytest.mark.tsar_torch
def test_a_plain_state_dict_stays_a_format_1_0_archive(cli, tmp_path):
    m = torch.nn.Linear(2, 2)
    orig, back, arc = roundtrip(cli, tmp_path, m.state_dict())
    assert deep_diff(back, orig) == ""
    data = arc.read_bytes()
    assert data[10:12] == b"\x00\x00" and data[52:56] == b"\x00\x00\x00\x00"  # minor 0, no flags


@pytest.mark.tsar_torch
def test_a_checkpoint_with_structure_is_format_1_1_with_the_tree_feature(cli, tmp_path):
    _, _, arc = roundtrip(cli, tmp_path, {"model": torch.nn.Linear(2, 2).state_dict(),
                                          "opt": [torch.zeros(1)]})
    data = arc.read_bytes()
    assert data[10:12] == b"\x01\x00" and data[52:56] == b"\x01\x00\x00\x00"


class Evil:
    """Unpickling this runs a shell command that creates a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.tsar_torch
def test_a_hostile_pickle_packs_as_opaque_data_and_never_runs(cli, tmp_path):
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "payload": Evil(marker)}, src)
    arc = tmp_path / "evil.tsar"
    r = subprocess.run([cli, "pack", str(src), "-o", str(arc)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([cli, "inspect", str(arc)], capture_output=True, text=True)
    assert r.returncode == 0 and "posix.system" in r.stdout, r.stdout
    back = tmp_path / "back.pt"
    subprocess.run([cli, "export", str(arc), "-o", str(back)], check=True, capture_output=True)
    subprocess.run([cli, "verify", str(arc)], check=True, capture_output=True)
    assert not marker.exists()  # nothing ran at pack, inspect, verify or export
    # --strict refuses to keep pickled code at all.
    r = subprocess.run([cli, "pack", "--strict", str(src), "-o", str(tmp_path / "s.tsar")],
                       capture_output=True, text=True)
    assert r.returncode == 3 and "posix.system" in r.stderr and "--strict" in r.stderr, r.stderr
    assert not marker.exists()


def test_bind_without_an_entry_takes_the_model_never_the_optimizer(cli, tmp_path):
    import tsar

    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    train(m, opt, 1, seed=3)
    # The optimizer first: its state becomes entries before "model".
    src, arc = tmp_path / "c.pt", tmp_path / "c.tsar"
    torch.save({"optimizer": opt.state_dict(), "model": m.state_dict()}, src)
    subprocess.run([cli, "pack", str(src), "-o", str(arc)], check=True, capture_output=True)
    with tsar.open(str(arc)) as a:
        assert a.entries[0].startswith("optimizer") and "model" in a.entries
    m2 = model().eval()
    report = tsar.load_into(m2, str(arc))
    assert not report.missing and not report.unexpected
    for k, t in m.state_dict().items():
        assert same_tensor(m2.state_dict()[k], t) == "", k
    # No "model" and two entries of parameters: it asks instead of guessing.
    two = tmp_path / "two.tsar"
    tsar.save({"a": m.state_dict(), "b": m.state_dict()}, str(two))
    with pytest.raises(tsar.Error) as ei:
        tsar.load_into(model().eval(), str(two))
    assert ei.value.code == tsar.ErrorCode.NOT_FOUND
    assert '"a", "b"' in str(ei.value) and "entry=" in str(ei.value)
    assert not tsar.load_into(model().eval(), str(two), entry="b").missing


@pytest.mark.tsar_torch
def test_the_value_tree_sample_exports_to_the_object_it_describes(cli, samples, tmp_path):
    back = tmp_path / "sample.pt"
    subprocess.run([cli, "export", os.path.join(samples, "valid", "value_tree.tsar"), "-o",
                    str(back)], check=True, capture_output=True)
    got = torch.load(back, weights_only=False)
    w = torch.tensor([1.0, 2.0])
    want = {"model": collections.OrderedDict(w=torch.nn.Parameter(w, requires_grad=False)), "step": torch.tensor(5),
            "epoch": 3, "lr": 0.25, "flag": True, "none": None, "big": 2**64, "name": "run\u00e9",
            "raw": b"\x00\xff", "groups": [(1, "a")], 7: "int key",
            "args": argparse.Namespace(w=torch.nn.Parameter(w, requires_grad=False)), "tail": ["x", "y"]}
    want["model"]._metadata = collections.OrderedDict({"": {"version": 1}})
    assert deep_diff(got, want) == ""
    assert got["args"].w is got["model"]["w"]  # one tensor record, one Python object
