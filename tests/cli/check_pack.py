#!/usr/bin/python3
"""check_pack.py INPUT.pt ARCHIVE.tsar [ENTRY_MODE]

Cross-checks a `tsar pack` of a torch.save file against what Python sees,
reading the archive with the independent reference decoder of the spec
(spec/reference/tsar_ref.py), not with tsar's C++ code:
names and their order, dtypes, shapes, strides, which tensors share a storage,
storage offsets relative to each other, requires_grad, parameter roles, and
every byte. Exits 0 when everything matches, 1 with a list of differences.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spec", "reference"))
import tsar_ref  # noqa: E402

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
          "complex32", "complex64", "complex128", "float8_e5m2", "float8_e4m3fn", "uint16", "uint32", "uint64",
          "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"]


def python_entries(obj):
    """{entry: [(name, tensor)]} as tsar pack maps a torch.save object."""
    def is_sd(d):
        return isinstance(d, dict) and d and all(isinstance(v, torch.Tensor) for v in d.values())
    if is_sd(obj):
        return {"model": list(obj.items())}
    out = {}
    loose = []

    def walk(d, prefix):
        for k, v in d.items():
            key = prefix + str(k)
            if isinstance(v, torch.Tensor):
                loose.append((key, v))
            elif is_sd(v):
                out[key] = list(v.items())
            elif isinstance(v, dict):
                walk(v, key + ".")
    walk(obj, "")
    if loose:
        out = {"model": loose, **out}
    return out


def main():
    pt, archive = sys.argv[1], sys.argv[2]
    obj = torch.load(pt, map_location="cpu")
    data = open(archive, "rb").read()
    r = tsar_ref.decode(data, archive)
    errors = []
    entries = [e[0].decode() for e in r["entries"]]
    want = python_entries(obj)
    if entries != list(want.keys()):
        errors.append(f"entries: python {list(want.keys())} tsar {entries}")
    storages = r["storages"]
    py_groups, ts_groups = {}, {}
    for e_index, (ename, first, count) in enumerate(r["entries"]):
        ename = ename.decode()
        py = want.get(ename, [])
        ts = r["tensors"][first:first + count]
        if [n for n, _ in py] != [t["name"].decode() for t in ts]:
            errors.append(f"{ename}: names/order differ")
            continue
        for (name, pt_t), t in zip(py, ts):
            where = f"{ename}/{name}"
            dtype = str(pt_t.dtype).replace("torch.", "")
            if DTYPES[t["dtype"] - 1] != dtype:
                errors.append(f"{where}: dtype {DTYPES[t['dtype'] - 1]} vs {dtype}")
                continue
            if list(pt_t.shape) != t["sizes"] or list(pt_t.stride()) != t["strides"]:
                errors.append(f"{where}: shape/strides {t['sizes']}/{t['strides']} vs {list(pt_t.shape)}/{list(pt_t.stride())}")
                continue
            if bool(t["rg"]) != pt_t.requires_grad:
                errors.append(f"{where}: requires_grad {t['rg']} vs {pt_t.requires_grad}")
            if (t["role"] == 1) != isinstance(pt_t, torch.nn.Parameter):
                errors.append(f"{where}: role {t['role']} vs Parameter={isinstance(pt_t, torch.nn.Parameter)}")
            off, nbytes, _ = storages[t["storage"]]
            raw = bytearray(data[off:off + nbytes]) or bytearray(1)
            base = torch.frombuffer(raw, dtype=pt_t.dtype) if nbytes else torch.empty(0, dtype=pt_t.dtype)
            got = base.as_strided(t["sizes"], t["strides"], t["sof"]) if pt_t.numel() else torch.empty(t["sizes"], dtype=pt_t.dtype)
            a = got.detach().contiguous().reshape(-1).view(torch.uint8) if pt_t.numel() else got
            b = pt_t.detach().contiguous().reshape(-1).view(torch.uint8) if pt_t.numel() else pt_t.detach()
            if not torch.equal(a, b):
                errors.append(f"{where}: bytes differ")
            # Storage identity, and the element offset relative to the storage's other users.
            key = pt_t.storage().data_ptr()
            py_groups.setdefault(key, []).append((where, pt_t.storage_offset() * pt_t.element_size()))
            ts_groups.setdefault(t["storage"], []).append((where, t["sof"] * pt_t.element_size()))
    norm = lambda groups: sorted(sorted(n for n, _ in g) for g in groups.values())  # noqa: E731
    if norm(py_groups) != norm(ts_groups):
        errors.append(f"storage sharing differs: python {norm(py_groups)} tsar {norm(ts_groups)}")
    py_rel = {n: o - min(x for _, x in g) for g in py_groups.values() for n, o in g}
    ts_rel = {n: o - min(x for _, x in g) for g in ts_groups.values() for n, o in g}
    for n in py_rel:
        if py_rel[n] != ts_rel.get(n):
            errors.append(f"{n}: relative byte offset {ts_rel.get(n)} vs {py_rel[n]}")
    if errors:
        print("\n".join(errors))
        return 1
    print(f"ok: {sum(len(v) for v in want.values())} tensors in {len(want)} entries match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
