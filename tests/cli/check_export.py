#!/usr/bin/python3
"""check_export.py ORIGINAL.pt EXPORTED [--shared-kept]

Reads a file that `tsar export` wrote with the reader its users have, and
compares it with the torch.save file the archive was packed from:
.pt with torch.load (names, order, dtypes, shapes, strides, bytes, _metadata,
and storage sharing), .h5 with h5py (groups as dotted names, dtypes, values),
.safetensors by the format's definition (header, offsets, bytes).
Exits 0 when everything matches, 1 listing the differences."""
import json
import struct
import sys

import torch

ST = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
      "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
      "F64": torch.float64, "C64": torch.complex64}


def flat(obj):
    """name -> tensor of a state_dict or of a dict of state_dicts ("entry/name")."""
    if all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj)
    return {f"{e}/{k}": v for e, sd in obj.items()
            if isinstance(sd, dict) and sd and all(isinstance(t, torch.Tensor) for t in sd.values())
            for k, v in sd.items()}


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a.to(torch.uint8), b.to(torch.uint8))
    return torch.equal(a, b) or torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def main():
    orig = torch.load(sys.argv[1])
    path = sys.argv[2]
    want = flat(orig)
    errors = []
    if path.endswith(".pt"):
        got_obj = torch.load(path)
        got = flat(got_obj)
        if list(got) != list(want):
            errors.append(f"names: {list(got)[:5]} vs {list(want)[:5]}")
        for k, v in want.items():
            g = got.get(k)
            if g is None or not same(v, g) or v.stride() != g.stride() or v.requires_grad != g.requires_grad:
                errors.append(f"{k}: differs")
        groups = lambda d: sorted(sorted(k for k in d if d[k].storage().data_ptr() == p)  # noqa: E731
                                  for p in {t.storage().data_ptr() for t in d.values()})
        if groups(want) != groups(got):
            errors.append("storage sharing differs")
        if hasattr(orig, "_metadata") and getattr(got_obj, "_metadata", None) != orig._metadata:
            errors.append("_metadata differs")
    elif path.endswith(".h5"):
        import h5py
        got = {}
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    got[name.replace("/", ".")] = torch.from_numpy(obj[()]) if obj.shape != () else torch.tensor(obj[()])
            f.visititems(visit)
        for k, v in want.items():
            g = got.get(k)
            if g is None:
                errors.append(f"{k}: missing")
            elif not same(v, g.to(v.dtype) if g.dtype != v.dtype and v.dtype == torch.bool else g):
                errors.append(f"{k}: differs ({g.dtype} {tuple(g.shape)} vs {v.dtype} {tuple(v.shape)})")
        if set(got) != set(want):
            errors.append(f"extra datasets: {sorted(set(got) - set(want))}")
    elif path.endswith(".safetensors"):
        data = open(path, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        header.pop("__metadata__", None)
        base = 8 + n
        for k, v in want.items():
            h = header.get(k)
            if h is None:
                errors.append(f"{k}: missing")
                continue
            b, e = h["data_offsets"]
            raw = bytearray(data[base + b: base + e])
            t = torch.frombuffer(raw, dtype=ST[h["dtype"]]).reshape(h["shape"]) if raw else torch.empty(h["shape"], dtype=ST[h["dtype"]])
            if not same(v, t):
                errors.append(f"{k}: differs")
    if errors:
        print("\n".join(errors))
        return 1
    print(f"ok: {len(want)} tensors match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
