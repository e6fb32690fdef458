#!/usr/bin/python3
"""p8_python.py --data DIR --samples FILE [--quick]: the Python benchmarks (bench/README.md).

P8  warm load of the 512 MiB model into a constructed torch.nn.Module:
    tsar.open + tsar.load_into against torch.load + load_state_dict.
P9  8 Python worker processes each holding the model (bound, one forward run
    so every weight is touched): summed memory, tsar against torch.load.

Appends rows to FILE in tsar_bench's samples format (bench,case,variant,unit,
run,value), which report.py reads. Needs the tsar package on sys.path
(run.sh sets PYTHONPATH to the bench build's python/ folder).
"""
import argparse
import csv
import gc
import os
import subprocess
import sys
import time

import torch

import tsar

LAYERS, WIDTH = 32, 2048  # bench/make_data.py's stack: 512 MiB of float32
MIB = 1024 * 1024


def stack_model():
    # Parameters from torch.empty (skip_init): no initialisation, no page touched.
    layers = [torch.nn.utils.skip_init(torch.nn.Linear, WIDTH, WIDTH) for _ in range(LAYERS)]
    return torch.nn.Sequential(*layers).eval()


def archive_for(data):
    path = os.path.join(data, "stack.tsar")
    if not os.path.exists(path):
        tsar.pack(os.path.join(data, "stack_sd.pt"), path)
    return path


# --- P8 ---------------------------------------------------------------------------
def p8(data, runs, emit):
    pt = os.path.join(data, "stack_sd.pt")
    archive = archive_for(data)
    case = "512 MiB, 64 tensors, warm"
    bound, copied = stack_model(), stack_model()
    times = {"tsar": [], "torch": []}

    def run_tsar():
        t0 = time.perf_counter()
        a = tsar.open(archive)
        tsar.load_into(bound, a)
        return time.perf_counter() - t0

    def run_torch():
        t0 = time.perf_counter()
        sd = torch.load(pt)
        copied.load_state_dict(sd)
        dt = time.perf_counter() - t0
        del sd
        gc.collect()
        return dt

    run_tsar(), run_torch()  # untimed: page cache warm, destination pages faulted in
    for _ in range(runs):  # interleaved, so drift hits both alike
        times["tsar"].append(run_tsar())
        times["torch"].append(run_torch())
    x = torch.ones(1, WIDTH)
    with torch.no_grad():
        if not torch.equal(bound(x), copied(x)):
            raise SystemExit("p8: the bound and the copied model give different outputs")
    for i, v in enumerate(times["tsar"]):
        emit("P8", case, "tsar.open + tsar.load_into", "ms", i, v * 1000)
    for i, v in enumerate(times["torch"]):
        emit("P8", case, "torch.load + load_state_dict", "ms", i, v * 1000)


# --- P9 ---------------------------------------------------------------------------
def worker(mode, data):
    """One worker process: builds the model, loads it as `mode`, touches every
    weight with a forward, says "ready", and holds until stdin closes."""
    torch.set_num_threads(1)
    model = stack_model()
    if mode == "tsar":
        tsar.load_into(model, archive_for(data))
    elif mode == "torch":
        sd = torch.load(os.path.join(data, "stack_sd.pt"))
        model.load_state_dict(sd)
        del sd
        gc.collect()
    if mode != "none":
        with torch.no_grad():
            model(torch.ones(1, WIDTH))
    print("ready", flush=True)
    sys.stdin.read()


def pss(pid, archive):
    """(Pss of anonymous memory, Pss of the archive's mapping) of a process, in bytes."""
    anon = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss_Anon:"):
                anon = int(line.split()[1]) * 1024
    mapped, current = 0, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                current = parts[5] if len(parts) > 5 else ""
            elif parts[0] == "Pss:" and current == archive:
                mapped += int(parts[1]) * 1024
    return anon, mapped


def group(mode, data, n, archive):
    env = dict(os.environ)
    procs = []
    try:
        for _ in range(n):
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", mode, "--data", data],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
            procs.append(p)
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"p9: a {mode} worker failed (exit {p.wait()})")
        sums = [pss(p.pid, archive) for p in procs]
        return sum(a for a, _ in sums), sum(m for _, m in sums)
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait(timeout=60)


def p9(data, runs, n, emit):
    archive = os.path.realpath(archive_for(data))
    case = f"{n} Python workers, 512 MiB model"
    for run in range(runs):
        base_anon, _ = group("none", data, n, archive)
        for mode, name in [("tsar", "tsar.load_into"), ("torch", "torch.load + load_state_dict")]:
            anon, mapped = group(mode, data, n, archive)
            emit("P9", case, f"{name}: summed Pss", "MiB", run, (anon + mapped) / MIB)
            emit("P9", case, f"{name}: model-attributable", "MiB", run, (anon + mapped - base_anon) / MIB)
        emit("P9", case, "no model (baseline): summed anonymous Pss", "MiB", run, base_anon / MIB)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--samples")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", choices=["none", "tsar", "torch"])
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.data)
    torch.set_num_threads(1)
    with open(args.samples, "a", newline="") as f:
        out = csv.writer(f, quoting=csv.QUOTE_ALL)

        def emit(bench, case, variant, unit, run, value):
            out.writerow([bench, case, variant, unit, run, f"{value:.6g}"])
            f.flush()

        p8(args.data, 3 if args.quick else 7, emit)
        p9(args.data, 1 if args.quick else 3, 8, emit)


if __name__ == "__main__":
    sys.exit(main())
