#!/usr/bin/python3
"""Writes the seed corpus of tests/fuzz/pickle_fuzzer.cc: the data.pkl of a few
torch.save archives (a state_dict, views and dtypes, parameters, plain Python
values), one file each. Needs torch; run: make_pickle_seeds.py OUT_DIR."""
import collections
import io
import os
import sys
import zipfile

import torch


def data_pkl(obj, protocol=2):
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=protocol)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        return z.read(name)


def seeds():
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    yield "state_dict", lin.state_dict()
    base = torch.arange(24, dtype=torch.float32)
    yield "views", {"base": base, "part": base[4:12].view(2, 4),
                    "tr": base[:12].view(3, 4).t(), "step": base[::5],
                    "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3),
                    "expanded": torch.ones(1, 3).expand(4, 3)}
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.float16, torch.bfloat16, torch.float64,
              torch.complex64, torch.complex128]
    yield "dtypes", collections.OrderedDict(
        (str(d).split(".")[1], torch.zeros(2, dtype=d)) for d in dtypes)
    yield "parameters", {"w": torch.nn.Parameter(torch.ones(2, 2)),
                         "frozen": torch.nn.Parameter(torch.ones(3), requires_grad=False),
                         "tied": [lin[0].weight, lin[0].weight]}
    yield "values", {"epoch": 3, "lr": 0.25, "name": "tinyé", "ok": True, "none": None,
                     "raw": b"\x00\xff", "empty_raw": b"", "neg": -7, "wide": 2 ** 40,
                     "nested": [(1, 2), {"a": [3.0]}, ()], 5: "int key"}
    yield "protocol4", {"t": torch.arange(6).view(2, 3), "s": "x" * 300}
    yield "refused_big_int", {"big": 2 ** 70}  # valid pickle the reader refuses


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, obj in seeds():
        protocol = 4 if name == "protocol4" else 2
        with open(os.path.join(out, name + ".pkl"), "wb") as f:
            f.write(data_pkl(obj, protocol))


if __name__ == "__main__":
    main()
