#!/usr/bin/env python3
"""Issue 27's figure: a model of about 1 GB, from process start to its first
logits, built on the meta device and bound with tsar.load_into, against the
same model built normally and then bound; warm page cache. Each case runs in a
fresh process (median of --runs). Anonymous memory is RssAnon (/proc/self/status)
sampled after the build, after the bind and after the forward, the largest of
the three minus RssAnon after the imports, against the model's size. Run with
the project's .venv:

    PYTHONPATH=build/python .venv/bin/python bench/meta_first_output.py [--runs 5]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import sys, time
t0 = float(sys.argv[1]); path = sys.argv[2]; how = sys.argv[3]
import torch, tsar
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
base = anon()
def build():
    return torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)])
peak = 0
if how == "meta":
    with torch.device("meta"):
        m = build()
else:
    m = build()
peak = max(peak, anon())
tsar.load_into(m.eval(), path)
peak = max(peak, anon())
with torch.no_grad():
    y = m(torch.ones(1, 4096))
peak = max(peak, anon())
print(time.time() - t0, peak - base, float(y.sum()))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    import torch
    import tsar

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.tsar")
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)])
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        tsar.save(model, path)
        del model
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # warm
        rows = {}
        for how in ("meta", "normal", "none"):
            times, peaks = [], []
            for _ in range(args.runs):
                if how == "none":  # the same process without the model: import + exit
                    code = "import sys, time; t0 = float(sys.argv[1]); import torch, tsar; print(time.time() - t0, 0, 0)"
                else:
                    code = CHILD
                t0 = time.time()
                out = subprocess.run([sys.executable, "-c", code, repr(t0), path, how],
                                     capture_output=True, text=True, check=True).stdout.split()
                times.append(float(out[0]))
                peaks.append(int(out[1]))
            rows[how] = (statistics.median(times), max(peaks))
        print(f"model: 16 x Linear(4096, 4096), {size / 2**20:.0f} MiB float32, warm page cache, "
              f"median of {args.runs} fresh processes")
        print(f"{'case':<40} {'start to logits':>16} {'anon. memory':>14} {'of model':>9}")
        names = {"meta": "built on meta, load_into",
                 "normal": "built normally, load_into",
                 "none": "python + import torch, tsar (no model)"}
        for how, (t, peak) in rows.items():
            print(f"{names[how]:<40} {t * 1000:>13.0f} ms {peak / 2**20:>10.1f} MiB {peak / size:>8.1%}")


if __name__ == "__main__":
    main()
