#!/usr/bin/python3
"""p9_warm.py --model a|b|c [--size tiny|small|bench] [--repeat N] [--peers NAME,...]
[--workdir DIR] [--touch] [--csv FILE]: issue 28's P9, warm open + bind, for
tsar and every peer adapter (adapters.py) on the same tensors.

Each peer gets its own file format, written from one reference model into
--workdir (a temporary directory unless given). Before timing, every file is
read once (page cache warm) and one untimed load is run. Then --repeat runs,
each of which times, in this order:
  build  the architecture, on meta where the peer allows it (spec.make);
  bind   open + bind into that module: issue 28's "P9 warm open + bind";
  touch  (--touch) then one byte read from every page of every tensor. The
         mapping peers defer their page faults to first touch, the streaming
         ones copy every byte during bind: bind + touch puts both on the same
         footing;
and, for a peer that builds its own architecture (from_pretrained), load:
construction + open + bind in one call, to be set against build + bind.
Medians are printed. Peers that cannot run here are listed with the reason.
Needs the tsar package on sys.path (PYTHONPATH=build/python).

The measurement (``measure``, ``run``) is importable for bench/run.sh's harness.
"""
import argparse
import csv
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from peers import adapters as peer_adapters  # noqa: E402
from peers import models  # noqa: E402

FIGURES = ("build", "bind", "touch", "load")


class Measurement:
    """One peer on one model: the runs of each figure in seconds, or the
    reason it was not measured."""

    def __init__(self, adapter, spec, path: Optional[str] = None, reason: Optional[str] = None):
        self.adapter, self.spec, self.path, self.reason = adapter, spec, path, reason
        self.runs: Dict[str, List[float]] = {f: [] for f in FIGURES}
        self.backend: Optional[str] = None  # tsar.backend() of the measuring process
        files = peer_adapters.files_of(path) if path else []
        self.file_bytes = sum(os.path.getsize(f) for f in files)
        self.n_files = len(files)

    def median(self, figure: str) -> Optional[float]:
        xs = self.runs[figure]
        return statistics.median(xs) if xs else None

    def bind_touch(self) -> Optional[float]:
        """Median of bind + touch, run by run."""
        pairs = list(zip(self.runs["bind"], self.runs["touch"]))
        return statistics.median(b + t for b, t in pairs) if pairs else None


def warm_page_cache(paths: List[str]) -> None:
    """Puts every file in the page cache the same way: written back, evicted
    (posix_fadvise DONTNEED), then read once from start to end. The eviction is
    not for coldness: how a file was written decides the size of its page-cache
    folios (measured here: a .tsar just written by tsar.save takes 46 ms to
    touch every page of 2 GiB, the same file evicted and re-read 14 ms, as the
    safetensors file does after the same treatment), so without it the peers
    would be timed on differently built caches."""
    evict(paths)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while os.read(fd, 1 << 24):
                pass
        finally:
            os.close(fd)


def evict(paths: List[str]) -> None:
    """Writes every file back and drops it from the page cache
    (posix_fadvise DONTNEED): no page of it is cached, as after a reboot."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(fn: Callable[[], object], collect: bool = True):
    """(seconds, result) of fn(), with the cyclic garbage collector off, as
    timeit does: a collection that the previous step's garbage happens to
    trigger (seconds with 100,000 modules alive) is not the step's cost.
    ``collect``: collect the garbage first. Not between building a module and
    binding it: a full collection walks the whole heap and leaves the CPU
    caches cold, which no server does between the two (it made every bind of
    a 423-module LLaMA 0.6 ms slower, for every peer alike)."""
    if collect:
        gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        result = fn()
        return time.perf_counter() - t0, result
    finally:
        if was:
            gc.enable()


def measure(adapter, spec, path: str, repeat: int, touch: bool = False) -> Measurement:
    """Times ``adapter`` on the prepared ``path`` (see the module docstring)."""
    m = Measurement(adapter, spec, path)
    warm_page_cache(peer_adapters.files_of(path))
    first = adapter.load(path, spec.make)  # untimed: imports, first-use costs
    del first
    for _ in range(repeat):
        if adapter.builds_architecture:
            dt, module = _timed(lambda: adapter.load(path, spec.make))
            m.runs["load"].append(dt)
        else:
            gc.collect()
            gc.disable()  # build, then bind straight after, as a server does
            try:
                dt, fresh = _timed(lambda: spec.make(adapter.meta), collect=False)
                m.runs["build"].append(dt)
                dt, module = _timed(lambda: adapter.bind(path, fresh), collect=False)
                m.runs["bind"].append(dt)
            finally:
                gc.enable()
            del fresh
        if touch:
            dt, _ = _timed(lambda: peer_adapters.touch_every_page(module))
            m.runs["touch"].append(dt)
        del module
    gc.collect()
    return m


def measure_apart(adapter, spec, path: str, repeat: int, touch: bool = False,
                  env: Optional[Dict[str, str]] = None) -> Measurement:
    """measure() in a fresh process of its own, where only torch, the model's
    code and this peer's library have run: no other library's objects, threads
    or heap state. Measured in one shared process after the others, tsar's
    bind of (b) took 1.1 ms and of (c) 312 ms, against 0.5 and about 160 ms
    alone; safetensors' 10.1 ms against 7.7. ``env``: variables set in that
    process (TSAR_PORTABLE chooses tsar's path). A process that imported tsar
    says which path it ran (tsar.backend()) in ``Measurement.backend``."""
    path_list = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE)] + path_list))
    cmd = [sys.executable, "-m", "peers.p9_warm", "--one", adapter.name, "--model", spec.kind,
           "--size", spec.size, "--repeat", str(repeat), "--path", path] + (["--touch"] if touch else [])
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed: {done.stderr.strip()[-2000:]}")
    m = Measurement(adapter, spec, path)
    lines = done.stdout.strip().splitlines()
    m.runs.update(json.loads(lines[-1]))
    m.backend = next((x[len("BACKEND "):] for x in lines if x.startswith("BACKEND ")), None)
    return m


def run(kind: str, size: str, repeat: int, names=(), workdir: Optional[str] = None,
        touch: bool = False, log=print) -> List[Measurement]:
    """Writes every peer's file from one reference model, then measures each."""
    spec = models.spec(kind, size)
    owned = None
    if workdir is None:
        owned = tempfile.TemporaryDirectory(prefix=f"p9_{kind}_{size}_")
        workdir = owned.name
    os.makedirs(workdir, exist_ok=True)
    log(f"# {spec.title}: building the reference weights")
    source = peer_adapters.Source(spec, spec.reference(), workdir)
    results = []
    try:
        for adapter in peer_adapters.by_name(names):
            reason = adapter.unavailable() or adapter.applies(spec)
            if reason:
                results.append(Measurement(adapter, spec, reason=reason))
                continue
            log(f"# {adapter.name}: writing {adapter.fmt}, timing {repeat} runs")
            try:
                path = adapter.prepare(source)
                results.append(measure_apart(adapter, spec, path, repeat, touch))
            except Exception as e:  # a peer that fails at this scale is a result too
                results.append(Measurement(adapter, spec, reason=f"failed: {type(e).__name__}: {e}"))
                log(f"# {adapter.name}: {results[-1].reason}")
                gc.collect()
    finally:
        if owned:
            owned.cleanup()
    return results


def _ms(x):
    return "-" if x is None else f"{x * 1e3:.2f}"


def table(results: List[Measurement]) -> str:
    tsar = next((r for r in results if r.adapter.name == "tsar" and r.median("bind")), None)
    head = ["peer", "version", "module", "build ms", "bind ms", "bind+touch ms", "load ms",
            "bind / tsar", "tensors are", "file MiB", "files"]
    rows, skipped = [], []
    for r in results:
        a = r.adapter
        if r.reason:
            skipped.append(f"  {a.name} {a.version}: {r.reason}")
            continue
        module = "its own (meta)" if a.builds_architecture else ("meta" if a.meta else "built normally")
        bind = r.median("bind")
        ratio = f"{bind / tsar.median('bind'):.1f}x" if tsar and bind else "-"
        where = "file mapping" if a.maps_file else "copies" + (" (O_DIRECT)" if a.direct_io else "")
        rows.append([a.name, a.version, module, _ms(r.median("build")), _ms(bind), _ms(r.bind_touch()),
                     _ms(r.median("load")), ratio, where, f"{r.file_bytes / 2**20:.1f}", str(r.n_files)])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = [" | ".join(str(x).ljust(w) for x, w in zip(head, widths))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in rows]
    calls = [f"  {r.adapter.name}: {r.adapter.calls}" for r in results if not r.reason]
    return "\n".join(lines + ["", "not measured:"] + (skipped or ["  none"]) + ["", "calls:"] + calls)


def write_csv(results: List[Measurement], path: str) -> None:
    """Appends one row per peer, figure and run (bench,case,variant,unit,run,
    value: tsar_bench's samples format); a peer not measured is one row whose
    unit is the reason and whose value is empty."""
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        for r in results:
            case = f"{r.spec.kind} {r.spec.size}"
            variant = f"{r.adapter.name} {r.adapter.version}"
            if r.reason:
                w.writerow(["P9 warm", case, variant, r.reason, 0, ""])
            for figure in FIGURES:
                for i, x in enumerate(r.runs[figure]):
                    w.writerow([f"P9 warm {figure}", case, variant, "s", i, f"{x:.9f}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=models.KINDS, required=True)
    ap.add_argument("--size", choices=models.SIZES, default="tiny")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--peers", default="", help="comma-separated adapter names (default: all)")
    ap.add_argument("--workdir", help="where the files are written (default: a temporary directory)")
    ap.add_argument("--touch", action="store_true", help="also time a read of every page after bind")
    ap.add_argument("--csv", help="append the runs to this samples file")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # measure_apart's child: this peer on --path
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        m = measure(peer_adapters.by_name([args.one])[0], models.spec(args.model, args.size), args.path,
                    args.repeat, args.touch)
        if "tsar" in sys.modules:
            print("BACKEND " + sys.modules["tsar"].backend())
        print(json.dumps(m.runs))
        return
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    results = run(args.model, args.size, args.repeat, names, args.workdir, args.touch,
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    print(f"P9 warm open + bind, model ({args.model}) {args.size}: {results[0].spec.title}; "
          f"median of {args.repeat}")
    print(table(results))
    if args.csv:
        write_csv(results, args.csv)


if __name__ == "__main__":
    main()
