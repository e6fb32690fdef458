#!/usr/bin/python3
"""p12_scale.py --cli TSAR --data DIR --out FILE [--samples CSV] [--sizes 10000,20000,40000,100000]

P12 (issue 11): how every command scales with the number of tensors. For each
size it makes mixture-of-experts-like inputs (f32 [8, 8] tensors named
layers.L.experts.E.w) as one safetensors file (laid out as the reference
writer does), four safetensors shards with a model.safetensors.index.json,
torch.save, TorchScript (torch.jit.save of a module tree) and HDF5 (h5py), then
times, whole process, each `tsar` command on them. With --samples, the P12
rows of tsar_bench's samples (bench/p12_api.cc: the C++ Writer, Archive::open,
state_dict, bind, in process) join the table.

Prints and writes a markdown table: seconds per command and size, and
microseconds per tensor; the last column is the time per tensor at the largest
size over that at the smallest (goal <= 1.5). Then issue 11's goals at 100k,
met or missed. Each command figure is the best of --runs runs; each C++ figure
the best of tsar_bench's nine runs. The whole-process times include process
start-up (the commands that need LibTorch load it), which the per-tensor
figures at 10k carry most.
"""
import argparse
import collections
import csv
import json
import os
import struct
import subprocess
import time

import h5py
import numpy as np
import torch

SHARDS = 4


def name(i):
    return f"layers.{i // 300}.experts.{i % 300}.w"


def write_safetensors(path, indices):
    header, off = {}, 0
    for i in indices:
        header[name(i)] = {"dtype": "F32", "shape": [8, 8], "data_offsets": [off, off + 256]}
        off += 256
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + np.arange(64, dtype=np.float32).tobytes() * len(indices))
    os.rename(path + ".tmp", path)


class Experts(torch.nn.Module):
    """A block of up to 300 parameters; the root holds a ModuleList of them."""

    def __init__(self, first, count):
        super().__init__()
        for j in range(count):
            self.register_parameter(f"w{j}", torch.nn.Parameter(torch.full((8, 8), float(first + j))))

    def forward(self, x):
        return x


class Root(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList([Experts(b, min(300, n - b)) for b in range(0, n, 300)])

    def forward(self, x):
        return x


def make(d, n):
    os.makedirs(d, exist_ok=True)
    st = os.path.join(d, "many.safetensors")
    if not os.path.exists(st):
        write_safetensors(st, range(n))
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        weight_map = {}
        per = (n + SHARDS - 1) // SHARDS
        for s in range(SHARDS):
            shard = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
            indices = range(s * per, min(n, (s + 1) * per))
            write_safetensors(os.path.join(d, shard), indices)
            weight_map.update({name(i): shard for i in indices})
        with open(index + ".tmp", "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
        os.rename(index + ".tmp", index)
    pt = os.path.join(d, "many.pt")
    if not os.path.exists(pt):
        torch.save(collections.OrderedDict((name(i), torch.full((8, 8), float(i))) for i in range(n)), pt + ".tmp")
        os.rename(pt + ".tmp", pt)
    ts = os.path.join(d, "many_ts.pt")
    if not os.path.exists(ts):
        torch.jit.save(torch.jit.script(Root(n)), ts + ".tmp")
        os.rename(ts + ".tmp", ts)
    h5 = os.path.join(d, "many.h5")
    if not os.path.exists(h5):
        with h5py.File(h5 + ".tmp", "w") as f:
            for i in range(n):
                f[name(i)] = np.full((8, 8), i, dtype=np.float32)
        os.rename(h5 + ".tmp", h5)


def best(cmd, runs):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return min(times)


def api_rows(samples, sizes):
    """tsar_bench's P12 rows: variant -> {n: seconds (best run)}."""
    runs = collections.defaultdict(list)
    with open(samples, newline="") as f:
        for row in csv.DictReader(f):
            if row["bench"] == "P12" and row["unit"] == "ms":
                runs[(row["variant"], int(row["case"].split()[0]))].append(float(row["value"]) / 1000)
    rows = collections.OrderedDict()
    for (variant, n), values in runs.items():
        if n in sizes:
            rows.setdefault(variant, {})[n] = min(values)
    return rows


# Issue 11's goals at 100k: command -> seconds.
GOALS = {"pack safetensors": 2.0, "pack torch.save": 2.0, "export .pt": 2.0, "export .safetensors": 2.0,
         "export .h5": 2.0, "inspect --json": 1.0, "diff": 1.0, "C++ Archive::open + bind": 0.050}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", help="tsar_bench's samples CSV, for the C++ rows")
    ap.add_argument("--sizes", default="10000,20000,40000,100000")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = collections.OrderedDict()
    for n in sizes:
        d = os.path.join(args.data, f"p12_{n}")
        make(d, n)
        a, b = os.path.join(d, "st.tsar"), os.path.join(d, "pt.tsar")
        cases = [
            ("pack safetensors", [args.cli, "pack", os.path.join(d, "many.safetensors"), "-o", a]),
            ("pack safetensors, 4 shards",
             [args.cli, "pack", os.path.join(d, "model.safetensors.index.json"), "-o", os.path.join(d, "sh.tsar")]),
            ("pack torch.save", [args.cli, "pack", os.path.join(d, "many.pt"), "-o", b]),
            ("pack TorchScript", [args.cli, "pack", os.path.join(d, "many_ts.pt"), "-o", os.path.join(d, "ts.tsar")]),
            ("pack HDF5", [args.cli, "pack", os.path.join(d, "many.h5"), "-o", os.path.join(d, "h5.tsar")]),
            ("inspect", [args.cli, "inspect", a]),
            ("inspect --json", [args.cli, "inspect", "--json", a]),
            ("verify", [args.cli, "verify", a]),
            ("diff", [args.cli, "diff", a, os.path.join(d, "sh.tsar")]),  # same tensors, other file
            ("residency", [args.cli, "residency", a]),
            ("export .pt", [args.cli, "export", a, "-o", os.path.join(d, "x.pt")]),
            ("export .safetensors", [args.cli, "export", a, "-o", os.path.join(d, "x.safetensors")]),
            ("export .h5", [args.cli, "export", a, "-o", os.path.join(d, "x.h5")]),
        ]
        for label, cmd in cases:
            rows.setdefault(label, {})[n] = best(cmd, args.runs)
            print(f"P12 {label} {n}: {rows[label][n]:.3f} s", flush=True)
    if args.samples:
        rows.update(api_rows(args.samples, sizes))
    lo, hi = sizes[0], sizes[-1]
    head = "| command | " + " | ".join(f"{n // 1000}k s (µs/tensor)" for n in sizes) + \
           f" | µs/tensor {hi // 1000}k / {lo // 1000}k |"
    lines = ["# P12: commands against the number of tensors", "",
             f"`bench/p12_scale.py`, whole process, best of {args.runs}; tensors f32 [8, 8]. "
             "C++ rows: `tsar_bench` (bench/p12_api.cc), in process, best of 9.", "",
             head, "|" + "---|" * (len(sizes) + 2)]
    for label, t in rows.items():
        if not all(n in t for n in sizes):
            continue
        cells = [f"{t[n]:.3f} ({t[n] / n * 1e6:.2f})" for n in sizes]
        ratio = (t[hi] / hi) / (t[lo] / lo)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratio:.2f}{'' if ratio <= 1.5 else ' **missed**'} |")
    lines += ["", f"Issue 11's goals at {hi // 1000}k tensors:", "", "| command | goal | measured | |", "|---|---|---|---|"]
    for label, goal in GOALS.items():
        t = rows.get(label, {}).get(hi)
        if t is not None:
            lines.append(f"| {label} | <= {goal * 1000:g} ms | {t * 1000:.0f} ms | {'met' if t <= goal else '**missed**'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
