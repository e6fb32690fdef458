#!/usr/bin/env python3
"""Seeds for the import fuzzer (tests/fuzz/import_fuzzer.cc), made at test time
with the real torch.save: small files with every kind of structure the torch.save
importer reads (state_dicts, nested dicts, lists, views, tied storages, every
dtype it maps) and safetensors files laid out as the reference writer does."""
import collections
import json
import os
import struct
import sys

import torch


def safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.contiguous().view(torch.int16).numpy().tobytes()
        code = {torch.float32: "F32", torch.int64: "I64", torch.bool: "BOOL", torch.float16: "F16",
                torch.bfloat16: "BF16", torch.uint8: "U8"}[t.dtype]
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    base = torch.arange(12, dtype=torch.float32)
    seeds = {
        "state_dict": collections.OrderedDict(w=torch.randn(3, 2), b=torch.zeros(3)),
        "views": {"base": base, "t": base.view(3, 4).t(), "part": base[2:7], "exp": base[:1].expand(5)},
        "nested": {"model": {"w": torch.ones(2, 2)}, "epoch": 3, "lr": 0.5, "name": "run"},
        "list": [torch.arange(3), torch.ones(2, dtype=torch.bool)],
        "dtypes": {str(d): torch.ones(2, dtype=d) for d in
                   (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int32, torch.uint8,
                    torch.complex64)},
        "empty": {"e": torch.zeros(0, 3), "s": torch.tensor(2.5)},
        "param": {"p": torch.nn.Parameter(torch.ones(2))},
    }
    tied = torch.randn(4, 2)
    seeds["tied"] = {"emb": tied, "head": tied}
    for name, obj in seeds.items():
        torch.save(obj, os.path.join(out, name + ".pt"))
    safetensors(os.path.join(out, "plain.safetensors"),
                {"a": torch.randn(2, 3), "b": torch.arange(4), "c": torch.ones(0, 2)})
    safetensors(os.path.join(out, "meta.safetensors"),
                {"h": torch.ones(3, dtype=torch.float16), "m": torch.ones(2, dtype=torch.bool)},
                {"format": "pt", "note": "x"})


if __name__ == "__main__":
    main(sys.argv[1])
