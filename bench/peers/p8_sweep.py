"""P8 sweep (issue 44): where the defaults stand among their neighbours. One
LLaMA-style bf16 archive (P8's model) onto the GPU through
``Archive.state_dict(device="cuda", ...)`` for a grid of fill threads,
streams, buffers and pinned memory, warm page cache (``--fresh``: the archive opened afresh for
every load, as P8 and a server's start do; else one open archive, whose
mapping the first load faulted in), beside the link's limit
(one pinned ``copy_`` of as many bytes) measured in the same run; every
result's bytes are checked against the archive's own mapped tensors.
Prints a markdown table, best of --repeat loads per setting, GB/s of tensor
bytes and the fraction of the limit. Without a GPU it says so and exits 0.

    python bench/peers/p8_sweep.py --size 4 --workdir DIR [--out FILE.md]
"""
import argparse
import itertools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from p8_gpu import make_state_dict, measure_limit, same_bytes, sync, warm  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=float, default=4, help="model size in GiB (default 4)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", default="0,8,12,16")
    ap.add_argument("--streams", default="0,2,4,8")
    ap.add_argument("--pinned-mib", default="64,128,256")
    ap.add_argument("--buffers", default="4")
    ap.add_argument("--fresh", action="store_true", help="open the archive afresh for every load")
    args = ap.parse_args(argv)
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    if not torch.cuda.is_available():
        say("P8 sweep: no CUDA device here: not measured")
        return 0
    import tsar
    os.makedirs(args.workdir, exist_ok=True)
    path = os.path.join(args.workdir, f"llama-{args.size:g}g.tsar")  # P8's file where it made one
    if not os.path.exists(path):
        tsar.save(make_state_dict(args.size), path)
    archive = tsar.open(path)
    want = archive.state_dict()
    names = list(want)
    nbytes = sum(s.nbytes() for s in {t.untyped_storage().data_ptr(): t.untyped_storage()
                                      for t in want.values()}.values())
    warm(path)
    limit = nbytes / min(measure_limit(path, nbytes, args.repeat)) / 1e9
    say(f"P8 sweep: {torch.cuda.get_device_name(0)}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {nbytes / 2**30:.2f} GiB archive; limit (pinned copy_) "
        f"{limit:.1f} GB/s; best of {args.repeat}; 0 = the staging rule's default")
    say()
    say(f"{'archive opened afresh for every load' if args.fresh else 'one open archive'}")
    say()
    say("| fill_threads | streams | buffers | pinned MiB | GB/s | x limit | bytes |")
    say("|---|---|---|---|---|---|---|")
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    for threads, streams, buffers, pinned in itertools.product(
            ints(args.threads), ints(args.streams), ints(args.buffers), ints(args.pinned_mib)):
        times, ok = [], True
        for _ in range(args.repeat):
            sync()
            t = time.perf_counter()
            a = tsar.open(path) if args.fresh else archive
            got = a.state_dict(device="cuda", pinned_bytes=pinned << 20, buffers=buffers,
                               streams=streams, fill_threads=threads)
            sync()
            times.append(time.perf_counter() - t)
            del a
            ok = ok and same_bytes(got, want, names[:: max(1, len(names) // 16)])
            del got
        rate = nbytes / min(times) / 1e9
        say(f"| {threads} | {streams} | {buffers} | {pinned} | {rate:.1f} | {rate / limit:.2f} | "
            f"{'exact' if ok else 'DIFFER'} |")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
