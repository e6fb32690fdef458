#!/usr/bin/python3
"""p12_scale.py --cli TSAR --data DIR --out FILE [--sizes 10000,20000,40000,100000]

P12 (issue 11): how every command scales with the number of tensors. For each
size it makes mixture-of-experts-like inputs (f32 [8, 8] tensors named
layers.L.experts.E.w) as safetensors (laid out as the reference writer does),
torch.save and HDF5 files, then times, whole process, each `tsar` command on
them. Prints and writes a markdown table: seconds per command and size, and
microseconds per tensor; the last column is the time per tensor at the largest
size over that at the smallest (goal <= 1.5). Each figure is the best of
--runs runs. The whole-process times include LibTorch's start-up (issue 13),
which the per-tensor figures at 10k carry most.
"""
import argparse
import collections
import json
import os
import struct
import subprocess
import time

import h5py
import numpy as np
import torch


def name(i):
    return f"layers.{i // 300}.experts.{i % 300}.w"


def make(d, n):
    os.makedirs(d, exist_ok=True)
    st = os.path.join(d, "many.safetensors")
    if not os.path.exists(st):
        header, off = {}, 0
        for i in range(n):
            header[name(i)] = {"dtype": "F32", "shape": [8, 8], "data_offsets": [off, off + 256]}
            off += 256
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(st, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + np.arange(64, dtype=np.float32).tobytes() * n)
    pt = os.path.join(d, "many.pt")
    if not os.path.exists(pt):
        torch.save(collections.OrderedDict((name(i), torch.full((8, 8), float(i))) for i in range(n)), pt)
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
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
            ("pack torch.save", [args.cli, "pack", os.path.join(d, "many.pt"), "-o", b]),
            ("pack HDF5", [args.cli, "pack", os.path.join(d, "many.h5"), "-o", os.path.join(d, "h5.tsar")]),
            ("inspect", [args.cli, "inspect", a]),
            ("inspect --json", [args.cli, "inspect", "--json", a]),
            ("verify", [args.cli, "verify", a]),
            ("diff", [args.cli, "diff", a, os.path.join(d, "st.tsar")]),
            ("residency", [args.cli, "residency", a]),
            ("export .pt", [args.cli, "export", a, "-o", os.path.join(d, "x.pt")]),
            ("export .safetensors", [args.cli, "export", a, "-o", os.path.join(d, "x.safetensors")]),
            ("export .h5", [args.cli, "export", a, "-o", os.path.join(d, "x.h5")]),
        ]
        for label, cmd in cases:
            rows.setdefault(label, {})[n] = best(cmd, args.runs)
            print(f"P12 {label} {n}: {rows[label][n]:.3f} s", flush=True)
    lo, hi = sizes[0], sizes[-1]
    head = "| command | " + " | ".join(f"{n // 1000}k s (µs/tensor)" for n in sizes) + \
           f" | µs/tensor {hi // 1000}k / {lo // 1000}k |"
    lines = ["# P12: commands against the number of tensors", "",
             f"`bench/p12_scale.py`, whole process, best of {args.runs}; tensors f32 [8, 8].", "",
             head, "|" + "---|" * (len(sizes) + 2)]
    for label, t in rows.items():
        cells = [f"{t[n]:.2f} ({t[n] / n * 1e6:.1f})" for n in sizes]
        ratio = (t[hi] / hi) / (t[lo] / lo)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
