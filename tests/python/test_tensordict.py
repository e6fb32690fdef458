"""A directory written by TensorDict's memmap() (tensordict from PyPI) as a pack
input: every tensor bit-exact under its nested key joined with '.', in order;
file names as TensorDict encodes them; bad directories refused, naming the file."""
import json
import os

import pytest
import torch

import tsar
from tsar_testutil import DTYPES, make_tensor, run_cli, same_tensor

tensordict = pytest.importorskip("tensordict")
from tensordict import NonTensorData, TensorDict  # noqa: E402

# The dtypes TensorDict's memmap() can write and read back (its dtype table).
TD_DTYPES = [d for d in DTYPES if str(d) in tensordict.utils._STR_DTYPE_TO_DTYPE]


def model_td():
    """Nested levels, every dtype TensorDict stores, a key it must encode, an empty
    tensor (no file at all), one above the mapping threshold and non-tensor data."""
    td = TensorDict({}, batch_size=[])
    for i, dtype in enumerate(TD_DTYPES):
        td[f"dtypes.{str(dtype)[6:]}"] = make_tensor(dtype, (3, 4), seed=i)
    td["encoder"] = TensorDict({"layer": TensorDict({"weight": make_tensor(torch.float32, (4, 4), 1),
                                                     "bias": make_tensor(torch.bfloat16, (4,), 2)}),
                                "big": make_tensor(torch.float32, (256, 128), 3)})  # 128 KiB: mapped
    td["odd key/with space"] = make_tensor(torch.int64, (2,), 4)
    td["empty"] = torch.zeros(0, 3)
    td["scalar"] = make_tensor(torch.float64, (), 5)
    td["note"] = NonTensorData("trained on nothing")
    return td


def flat_tensors(td):
    """{dotted name: tensor} in TensorDict's key order, as tsar names them."""
    out = {}
    for key, value in td.items():
        if isinstance(value, NonTensorData):
            continue
        if isinstance(value, TensorDict):
            out.update({f"{key}.{k}": v for k, v in flat_tensors(value).items()})
        else:
            out[key] = value
    return out


def test_memmap_directory_packs_exactly(tmp_path, cli):
    td = model_td()
    td.memmap(str(tmp_path / "td"))
    assert os.path.exists(tmp_path / "td" / "odd%20key%2Fwith%20space.memmap")  # TensorDict encodes
    assert not os.path.exists(tmp_path / "td" / "empty.memmap")  # torch.from_file writes none
    want = flat_tensors(td)
    r = run_cli(cli, "pack", tmp_path / "td", "-o", tmp_path / "a.tsar", "-q")
    with tsar.open(str(tmp_path / "a.tsar"), verify="full") as a:
        assert a.keys() == list(want)  # meta.json's order, nested keys joined with '.'
        for name, t in want.items():
            assert same_tensor(a[name], t.contiguous()) == "", name
        assert a.metadata("model")["note"] == "trained on nothing"  # entry metadata
    # The Python API, and the meta.json path standing for its directory: same bytes.
    summary = tsar.pack(str(tmp_path / "td"), str(tmp_path / "b.tsar"))
    assert summary.tensors == len(want)
    run_cli(cli, "pack", tmp_path / "td" / "meta.json", "-o", tmp_path / "c.tsar", "-q")
    data = open(tmp_path / "a.tsar", "rb").read()
    assert open(tmp_path / "b.tsar", "rb").read() == data == open(tmp_path / "c.tsar", "rb").read()
    # What TensorDict itself loads back is what the archive holds.
    loaded = TensorDict.load_memmap(str(tmp_path / "td"))
    with tsar.open(str(tmp_path / "a.tsar")) as a:
        for name, t in flat_tensors(loaded).items():
            assert same_tensor(a[name], t.contiguous()) == "", name
    err = run_cli(cli, "inspect", tmp_path / "td", code=3).stderr
    assert "a TensorDict memmap directory, not a tsar archive; pack it first" in err


def test_bad_directories_are_refused_naming_the_file(tmp_path, cli):
    td = TensorDict({"w": torch.arange(64, dtype=torch.float32), "n": {"b": torch.ones(3)}}, [])
    src = tmp_path / "td"
    td.memmap(str(src))

    def refused(path, code, *needles):
        r = run_cli(cli, "pack", path, "-o", tmp_path / "out.tsar", "-q", code=code)
        for needle in needles:
            assert needle in r.stderr, r.stderr
        assert not os.path.exists(tmp_path / "out.tsar")

    # A truncated tensor file: its path and the byte counts.
    w = src / "w.memmap"
    good = w.read_bytes()
    w.write_bytes(good[:100])
    refused(src, 3, str(w), "expected at least 256 bytes", "found 100")
    w.unlink()
    refused(src, 3, "meta.json", "key \"w\"", "w.memmap", "found no such file")
    w.write_bytes(good)
    # A dtype tsar has no code for, a nested (jagged) tensor, a newer layout.
    meta_path = src / "meta.json"
    meta = json.loads(meta_path.read_text())
    for edit, needles in [
        (lambda m: m["w"].update(dtype="torch.qint8"), (3, "dtype", "torch.qint8")),
        (lambda m: m["w"].update(is_nested=True), (3, "nested (jagged) tensor")),
        (lambda m: m.update(_format_version=7), (3, "_format_version", "found 7")),
        (lambda m: m["w"].update(shape=[-1]), (3, "shape[0]", "non-negative")),
    ]:
        bad = json.loads(json.dumps(meta))
        edit(bad)
        meta_path.write_text(json.dumps(bad))
        refused(src, *needles)
    meta_path.write_text('{"w": {"dtype": "torch.float32", "shape": [64]}, "w": {}}')
    refused(src, 3, "meta.json", "\"w\" appears twice")
    meta_path.write_text(json.dumps(meta))
    # A directory nobody wrote with memmap().
    os.makedirs(tmp_path / "plain")
    refused(tmp_path / "plain", 3, "memmap() wrote (meta.json)", "save_pretrained",
            "found an empty directory")
    run_cli(cli, "pack", src, "-o", tmp_path / "ok.tsar", "-q")  # the restored one packs
