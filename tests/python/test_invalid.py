"""Invalid archives raise tsar.Error with the right code, offset and message;
no truncation or corruption crashes the process; verify() finds damage."""
import csv
import glob
import importlib.util
import json
import os
import struct

import pytest
import torch

import tsar
from tsar_testutil import same_tensor

CODES = {
    "io": 1, "not_found": 2, "invalid_argument": 3, "truncated": 4, "bad_magic": 5,
    "unsupported_version": 6, "reserved_non_zero": 7, "out_of_bounds": 8, "overlap": 9,
    "misaligned": 10, "overflow": 11, "bad_dtype": 12, "bad_shape": 13, "duplicate_name": 14,
    "checksum_mismatch": 15, "invalid_value": 16, "bad_input": 17, "unsupported": 18,
    "bind_mismatch": 19, "base_mismatch": 20,
}


def test_error_code_enum():
    assert issubclass(tsar.Error, RuntimeError)
    assert {c.name.lower(): int(c) for c in tsar.ErrorCode} == CODES
    for name, value in CODES.items():
        assert tsar.ErrorCode[name.upper()] == value


def manifest(samples):
    with open(os.path.join(samples, "invalid", "MANIFEST.tsv"), newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) >= 40
    return rows


def test_manifest_covers_every_invalid_sample(samples):
    listed = {r["file"] for r in manifest(samples)}
    on_disk = {os.path.basename(p) for p in glob.glob(os.path.join(samples, "invalid", "*.tsar"))}
    assert listed == on_disk


@pytest.mark.parametrize("verify", ["index", "full"])
def test_every_invalid_sample(samples, verify):
    failures = []
    for row in manifest(samples):
        path = os.path.join(samples, "invalid", row["file"])
        try:
            tsar.open(path, verify=verify)
        except tsar.Error as e:
            want_code = tsar.ErrorCode[row["code"].upper()]
            want_msg = path + row["message"][len(row["file"]):]
            if e.code != want_code:
                failures.append(f"{row['file']}: code {e.code!r}, manifest {row['code']}")
            if e.offset != int(row["offset"]):
                failures.append(f"{row['file']}: offset {e.offset}, manifest {row['offset']}")
            if e.path != path:
                failures.append(f"{row['file']}: path {e.path!r}")
            if str(e) != want_msg:
                failures.append(f"{row['file']}: message\n  {e}\n  expected\n  {want_msg}")
        else:
            failures.append(f"{row['file']}: opened without error")
    assert not failures, "\n".join(failures)


def valid_samples(samples):
    paths = sorted(glob.glob(os.path.join(samples, "valid", "*.tsar")))
    assert len(paths) >= 8
    return paths


def test_valid_samples_match_their_expected_json(samples):
    # Every dtype of the format, those this torch has (float8_e8m0fnu came with
    # torch 2.7, float4_e2m1fn_x2 with 2.8): a tensor of another one is skipped.
    every = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
             "float64", "complex32", "complex64", "complex128", "float8_e5m2", "float8_e4m3fn",
             "uint16", "uint32", "uint64", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
             "float4_e2m1fn_x2"]
    names = {n: getattr(torch, n) for n in every if hasattr(torch, n)}
    checked = 0
    dtypes = set()
    for path in valid_samples(samples):
        want = json.load(open(path[:-len(".tsar")] + ".expected.json"))
        data = open(path, "rb").read()
        with tsar.open(path, verify="full") as a:
            assert a.file_size == want["file_size"] == len(data), path
            assert a.format_version == tuple(int(x) for x in want["format_version"].split("."))
            a.verify()
            assert a.damaged() == []
            sparse_names = {(s["entry"], s["name"], s["layout"]) for s in want["sparse"]}
            for t in want["tensors"]:
                if t["role"] == "sparse_component" or t["dtype"] not in names:
                    continue
                where = f"{path}: {t['entry']}/{t['name']}"
                assert t["name"] in a.keys(t["entry"]), where
                info = a.info(t["name"], entry=t["entry"])
                assert info.dtype == names[t["dtype"]], where
                dtypes.add(t["dtype"])
                assert (info.shape, info.strides) == (tuple(t["shape"]), tuple(t["strides"])), where
                assert (info.storage, info.storage_offset) == (t["storage"], t["storage_offset"]), where
                assert (info.role, info.requires_grad) == (t["role"], t["requires_grad"]), where
                got = a.tensor(t["name"], entry=t["entry"])
                assert got.dtype == names[t["dtype"]] and tuple(got.shape) == tuple(t["shape"]), where
                assert tuple(got.stride()) == tuple(t["strides"]), where
                # The values are the file's bytes at the storage's offset; a
                # layer's base storage (spec §4.11) is the base's, in the base file.
                rec, src = want["storages"][t["storage"]], data
                if "base_storage" in rec:
                    base = a.layers[1]
                    base_want = json.load(open(base[:-len(".tsar")] + ".expected.json"))
                    rec, src = base_want["storages"][rec["base_storage"]], open(base, "rb").read()
                off, nbytes = rec["offset"], rec["nbytes"]
                if got.numel() and "shard_dim" in t:
                    # Format 1.4 (spec §4.12): the storage holds the world's
                    # slices along shard_dim, each block_stride apart.
                    world, dim = want["tp_world"], t["shard_dim"]
                    align = struct.unpack_from("<I", data, 48)[0]
                    slice_bytes = got.numel() // world * got.element_size()
                    a_ = align if slice_bytes >= align else 64
                    stride = (slice_bytes + a_ - 1) // a_ * a_
                    shape = list(t["shape"])
                    shape[dim] //= world
                    parts = [torch.frombuffer(bytearray(src[off + r * stride:off + r * stride + slice_bytes]),
                                              dtype=torch.uint8).view(got.dtype).view(shape)
                             for r in range(world)]
                    assert same_tensor(got.contiguous(), torch.cat(parts, dim)) == "", where
                elif got.numel():
                    raw = bytearray(src[off:off + nbytes])
                    flat = torch.frombuffer(raw, dtype=torch.uint8)
                    flat = flat[:(len(raw) // got.element_size()) * got.element_size()].view(got.dtype)
                    expect = flat.as_strided(t["shape"], t["strides"], t["storage_offset"])
                    assert same_tensor(got, expect) == "", where
                checked += 1
            for entry, name, layout in sparse_names:
                ename = a.entries[entry]
                assert name in a.keys(ename)
                if layout == "group":  # spec §4.13: rebuilt by torchao where it is installed
                    if importlib.util.find_spec("torchao") is not None:
                        g = a.tensor(name, entry=ename)
                        assert type(g).__name__ == "Int8Tensor", name
                        assert torch.equal(g.qdata, a.tensor(name + ".qdata", entry=ename))
                    continue
                s = a.tensor(name, entry=ename)
                assert s.layout in (torch.sparse_coo, torch.sparse_csr), name
    assert checked >= 25
    assert dtypes == set(names), set(names) - dtypes  # every dtype is in some sample


def test_sparse_sample(samples):
    with tsar.open(os.path.join(samples, "valid", "sparse.tsar")) as a:
        assert a.keys() == ["bias", "adj", "m"]
        adj, m = a["adj"], a["m"]
        assert adj.layout == torch.sparse_coo and tuple(adj.shape) == (3, 3)
        assert m.layout == torch.sparse_csr and tuple(m.shape) == (2, 2)
        idx, vals = a.info("adj.indices"), a.info("adj.values")
        assert idx.role == vals.role == "sparse_component"
        assert torch.equal(adj._indices(), a.tensor("adj.indices"))
        assert torch.equal(adj._values(), a.tensor("adj.values"))
        dense = torch.zeros(3, 3)
        ind, v = a.tensor("adj.indices"), a.tensor("adj.values")
        for k in range(v.numel()):
            dense[ind[0, k], ind[1, k]] += v[k]
        assert torch.equal(adj.to_dense(), dense)


def small_archive(tmp_path):
    path = str(tmp_path / "small.tsar")
    tsar.save({"a": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, 2, dtype=torch.int64),
               "c": torch.tensor(7, dtype=torch.int16)}, path,
              metadata={"note": "truncate me", "n": 3}, alignment=64)
    return path


def test_every_truncation_raises(tmp_path, samples):
    sources = [small_archive(tmp_path)] + valid_samples(samples)
    cut = str(tmp_path / "cut.tsar")
    opened = 0
    for src in sources:
        data = open(src, "rb").read()
        for n in range(len(data)):
            with open(cut, "wb") as f:
                f.write(data[:n])
            with pytest.raises(tsar.Error) as ei:
                tsar.open(cut)
            code = ei.value.code
            assert code in (tsar.ErrorCode.TRUNCATED, tsar.ErrorCode.BAD_MAGIC), (src, n, str(ei.value))
            if n >= 64:
                assert code == tsar.ErrorCode.TRUNCATED, (src, n, str(ei.value))
        with open(cut, "wb") as f:
            f.write(data + b"\0")
        with pytest.raises(tsar.Error) as ei:
            tsar.open(cut)
        assert ei.value.code == tsar.ErrorCode.INVALID_VALUE
        with open(cut, "wb") as f:
            f.write(data)
        # A layer copied alone finds its base through the search list.
        with tsar.open(cut, base_dirs=[os.path.dirname(src)]) as a:
            opened += 1
            assert a.file_size == len(data)
    assert opened == len(sources)


def test_every_head_byte_flip_raises_and_data_flips_are_found(tmp_path):
    src = small_archive(tmp_path)
    data = open(src, "rb").read()
    with tsar.open(src) as a:
        a.verify()
    data_offset = struct.unpack_from("<Q", data, 40)[0]
    bad = str(tmp_path / "bad.tsar")
    for i in range(data_offset):
        flipped = bytearray(data)
        flipped[i] ^= 0x41
        with open(bad, "wb") as f:
            f.write(flipped)
        with pytest.raises(tsar.Error):
            tsar.open(bad)
    # A byte of tensor "a" (storage #0, the first in the data region) damaged.
    flipped = bytearray(data)
    flipped[data_offset + 4] ^= 0xFF
    with open(bad, "wb") as f:
        f.write(flipped)
    with tsar.open(bad) as a:            # the index is fine: verify="index" opens it
        assert a.damaged() == ["model/a"]
        with pytest.raises(tsar.Error) as ei:
            a.verify()
        assert ei.value.code == tsar.ErrorCode.CHECKSUM_MISMATCH
        assert ei.value.offset == data_offset
        assert str(ei.value).startswith(f'{bad}: offset {data_offset} (0x{data_offset:x}): storage #0 (tensors "model/a")')
        assert torch.equal(a["b"], torch.ones(3, 2, dtype=torch.int64))
    with pytest.raises(tsar.Error) as ei:
        tsar.open(bad, verify="full")
    assert ei.value.code == tsar.ErrorCode.CHECKSUM_MISMATCH


def test_verify_names_every_tensor_of_a_damaged_storage(tmp_path):
    base = torch.arange(64, dtype=torch.float32)
    sd = {"full": base, "view": base[8:16], "other": torch.zeros(16)}
    path = str(tmp_path / "v.tsar")
    tsar.save(sd, path, alignment=64)
    data = bytearray(open(path, "rb").read())
    data_offset = struct.unpack_from("<Q", data, 40)[0]
    data[data_offset] ^= 1   # storage #0, shared by "full" and "view"
    bad = str(tmp_path / "bad.tsar")
    open(bad, "wb").write(data)
    with tsar.open(bad) as a:
        assert sorted(a.damaged()) == ["model/full", "model/view"]
        with pytest.raises(tsar.Error) as ei:
            a.verify()
        assert ei.value.code == tsar.ErrorCode.CHECKSUM_MISMATCH
        assert ei.value.offset == data_offset and ei.value.path == bad
        assert str(ei.value).startswith(
            f'{bad}: offset {data_offset} (0x{data_offset:x}): storage #0 (tensors "model/full", "model/view"): '
            "xxh3: expected 0x"), str(ei.value)
        assert "other" not in str(ei.value)


def test_not_an_archive(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not an archive at all " * 10)
    pt = str(tmp_path / "sd.pt")
    torch.save({"w": torch.ones(3)}, pt)
    for p in [str(text), pt]:
        with pytest.raises(tsar.Error) as ei:
            tsar.open(p)
        assert ei.value.code == tsar.ErrorCode.BAD_MAGIC, p
        assert ei.value.offset == 0
        assert str(ei.value).startswith(f"{p}: offset 0 (0x0): magic: expected 89 54 53 41 52 0d 0a 1a, found ")
    missing = str(tmp_path / "does-not-exist.tsar")
    with pytest.raises(tsar.Error) as ei:
        tsar.open(missing)
    assert ei.value.code == tsar.ErrorCode.NOT_FOUND  # ENOENT (loader/open_file.cc)
    assert ei.value.path == missing
    assert str(ei.value) == f"{missing}: cannot open: No such file or directory"
    with pytest.raises(tsar.Error) as ei:
        tsar.open(str(tmp_path))
    assert ei.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert str(ei.value) == f"{tmp_path}: not a regular file (it is a directory)"
