"""P13 cold, tsar with and without readahead of the whole file at open
(issue 28: "cold at least 0.95x of the disk's read bandwidth"). Model (b), the
2 GiB LLaMA-style decoder: per round, the disk's read bandwidth (16 MiB
reads of the evicted file), then a fresh process from exec to first output
on a cold cache with `load_into(path)` and with `load_into(path,
prefetch="willneed")`, in alternating order, and each warm once. The
shared disk of these machines varies from run to run, so the rounds
interleave everything and the read rates are each against its own round's
bandwidth.

    cd bench && PYTHONPATH=../build/python python -m peers.p13_prefetch --workdir DIR [--rounds 4]
"""
import argparse
import os
import statistics

from peers import adapters, models, procs

PEERS = ("tsar", "tsar (prefetch=willneed)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--size", default="bench")
    args = ap.parse_args()
    spec = models.spec("b", args.size)
    os.makedirs(os.path.join(args.workdir, "b"), exist_ok=True)
    src = adapters.Source(spec, spec.reference(), os.path.join(args.workdir, "b"))
    path = adapters.by_name(["tsar"])[0].prepare(src)
    files = adapters.files_of(path)
    nbytes = sum(os.path.getsize(f) for f in files)
    rates = {p: [] for p in PEERS}
    colds = {p: [] for p in PEERS}
    for r in range(args.rounds):
        bw = procs.disk_bandwidth(path)
        order = PEERS if r % 2 == 0 else PEERS[::-1]
        line = [f"round {r}: disk {bw / 2**20:.0f} MiB/s"]
        for peer in order:
            warm = procs.first_output(peer, "b", args.size, path, files, False)
            cold = procs.first_output(peer, "b", args.size, path, files, True)
            rate = nbytes / (cold - warm) if cold > warm else float("inf")
            rates[peer].append(rate / bw)
            colds[peer].append(cold)
            line.append(f"{peer}: warm {warm * 1e3:.0f} ms, cold {cold * 1e3:.0f} ms, "
                        f"{rate / 2**20:.0f} MiB/s = {rate / bw:.2f}x")
        print("; ".join(line), flush=True)
    print("\n| load_into | cold first output, median | cold read rate / disk, median (min-max) |")
    print("|---|---|---|")
    for peer in PEERS:
        print(f"| {peer} | {statistics.median(colds[peer]) * 1e3:.0f} ms | "
              f"{statistics.median(rates[peer]):.2f}x ({min(rates[peer]):.2f}-{max(rates[peer]):.2f}) |")


if __name__ == "__main__":
    main()
