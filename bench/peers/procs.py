"""The measures of issue 28 that need fresh processes, each peer and tsar on
the same files: P13 first output (exec to the first forward's result, warm
and cold page cache), P14 (8 processes started together on a cold cache,
until all have answered) and P3 (8 workers holding the model: summed Pss
above 8 workers that hold none).

A worker is ``python -m peers.procs worker PEER KIND SIZE PATH``: it builds the
architecture, loads PATH with the peer's adapter, runs one forward and prints
``READY <seconds since its own exec to the first output>`` (the exec time
comes from the parent in TSAR_BENCH_T0, time.time() just before the spawn);
with --phases it then runs a second forward and
prints ``LOAD <s> FIRST <s> SECOND <s>``: the peer's import + open + bind into
the module built on meta, and the two forwards. With --hold it then reads
every page of its tensors, prints ``HELD`` and waits for its stdin to close,
so that the parent can read its Pss. PEER
"meta" loads nothing: it imports torch, builds the architecture on meta and
holds (the floor of P13 and P3).

Cold: every file of the model is written back and evicted with
posix_fadvise(POSIX_FADV_DONTNEED) before the spawn (no page of it is cached,
as after a reboot); warm: evicted, then read once with read(2) from start to
end (p9_warm.warm_page_cache), so every peer's file is cached the same way.
The disk's read bandwidth is measured in the same run: the largest file,
evicted, then read with 16 MiB read(2) calls.
"""
import argparse
import contextlib
import gc
import os
import subprocess
import sys
import time
from typing import List

from peers.p9_warm import evict, warm_page_cache

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)


def disk_bandwidth(path: str, settle: float = 0.0) -> float:
    """Bytes per second of reading `path` from the disk with 16 MiB reads,
    `settle` seconds after evicting it.

    `settle` matters on a VM whose kernel hands freed memory back to the host
    (virtio-balloon free page reporting, as on this project's machines): the
    eviction frees the file's pages, the host takes them back within seconds,
    and a read that comes later must get them back one by one, which costs
    more than the disk. Measured here on the 2 GiB file: 1.6 GB/s read at
    once, 1.2 GB/s after 3 s, 0.6 GB/s after 13 s, 0.5 GB/s after 20 s. A
    cold start that reads 13 s after the eviction meets the 13 s state."""
    evict([path])
    if settle > 0:
        time.sleep(settle)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        n = 0
        while True:
            b = os.read(fd, 16 << 20)
            if not b:
                break
            n += len(b)
        return n / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def fresh_memory_rate(nbytes: int, settle: float) -> float:
    """Bytes per second of the first write to `nbytes` of new anonymous
    memory, `settle` seconds after as much was freed: the cost of memory the
    host has taken back, with no disk in it (free page reporting, see
    disk_bandwidth)."""
    import ctypes
    import mmap

    def first_write() -> float:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)  # 2 MiB blocks, as the page cache's large folios take
        anchor = ctypes.c_char.from_buffer(m)
        t0 = time.perf_counter()
        ctypes.memset(ctypes.addressof(anchor), 1, nbytes)
        dt = time.perf_counter() - t0
        del anchor
        m.close()
        return dt

    first_write()  # memory to free: written, then unmapped
    if settle > 0:
        time.sleep(settle)
    return nbytes / first_write()


def threads_per_worker(n: int) -> int:
    """Intra-op threads for each of n workers sharing this machine's cores, as a
    server with n workers sets them (OMP_NUM_THREADS): with torch's default
    every worker runs one thread per core, and 8 workers on 2 cores took 37 s
    instead of 16 s to answer, with seconds of run-to-run spread."""
    return max(1, (os.cpu_count() or 1) // n)


def spawn(peer: str, kind: str, size: str, path: str, hold: bool = False,
          phases: bool = False, threads: int = 0) -> subprocess.Popen:
    """A worker; threads > 0 sets its OMP_NUM_THREADS."""
    env = dict(os.environ, TSAR_BENCH_T0=repr(time.time()), PYTHONPATH=os.pathsep.join(
        [BENCH] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "peers.procs", "worker", peer, kind, size, path]
    if hold:
        cmd.append("--hold")
    if phases:
        cmd.append("--phases")
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def ready(p: subprocess.Popen, timeout: float = 600) -> float:
    """The worker's seconds from exec to its first output (raises if it failed)."""
    return ready_phases(p)["READY"]


def ready_phases(p: subprocess.Popen, phases: bool = False) -> dict:
    """The worker's READY line as {"READY": s}, with ``phases`` (a worker
    spawned with phases=True) also its next line's "LOAD", "FIRST" and
    "SECOND"; raises if it failed."""
    words = []
    for want in ("READY", "LOAD") if phases else ("READY",):
        line = p.stdout.readline()
        if not line.startswith(want + " "):
            p.kill()
            raise RuntimeError(f"worker failed: {line.strip()} {p.stderr.read()[-2000:]}")
        words += line.split()
    return {k: float(v) for k, v in zip(words[::2], words[1::2])}


def first_output(peer: str, kind: str, size: str, path: str, files: List[str], cold: bool) -> float:
    return first_output_phases(peer, kind, size, path, files, cold)["READY"]


def first_output_phases(peer: str, kind: str, size: str, path: str, files: List[str],
                        cold: bool) -> dict:
    """One fresh worker on a warm or cold cache: ready_phases() of its line,
    plus "OWN": the loader's own part of the first output, LOAD + FIRST -
    SECOND (what is left when the forward itself is taken out)."""
    if cold:
        evict(files)
    else:
        warm_page_cache(files)
    phases = peer != "meta"
    p = spawn(peer, kind, size, path, phases=phases)
    t = ready_phases(p, phases)
    p.stdin.close()
    p.wait()
    if "LOAD" in t:
        t["OWN"] = t["LOAD"] + t["FIRST"] - t["SECOND"]
    return t


class Residency:
    """Watches how much of a file is in the page cache (mincore over a
    mapping that touches nothing), every `every` seconds on a thread: when its
    first page arrived and when 99% of it had, so a cold start's own read
    rate is its bytes over that span."""

    def __init__(self, path: str, every: float = 0.1):
        import ctypes
        import mmap
        import threading

        self._size = os.path.getsize(path)
        self._f = open(path, "rb")
        self._m = mmap.mmap(self._f.fileno(), self._size, access=mmap.ACCESS_COPY)
        self._anchor = ctypes.c_char.from_buffer(self._m)
        self._vec = (ctypes.c_ubyte * self.STRIPE)()
        self._mincore = ctypes.CDLL(None).mincore
        self._every, self.first, self.full = every, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    # A look covers 256 KiB in every 16 MiB of the file. One mincore over all
    # of a 2 GiB file took 3.4 ms evicted and 10 ms cached here, every 0.1 s
    # through a cold start on 2 busy cores: about 0.35 s of the start's
    # time taken from the workers. The stripes take 0.3-0.4 ms and still
    # see the first 16 MiB that arrives.
    STRIPE, EVERY = 64, 4096  # pages

    def cached(self) -> int:
        """Bytes of the file in the page cache, estimated from the stripes
        (exact for a file of at most one stripe, 256 KiB)."""
        import ctypes

        pages = (self._size + 4095) // 4096
        base = ctypes.addressof(self._anchor)
        seen = looked = 0
        for first in range(0, pages, self.EVERY):
            n = min(self.STRIPE, pages - first)
            self._mincore(ctypes.c_void_p(base + first * 4096),
                          ctypes.c_size_t(min(n * 4096, self._size - first * 4096)), self._vec)
            seen += bytes(self._vec[:n]).count(1)  # bit 0: cached; the others are 0
            looked += n
        return min(self._size, seen * self._size // looked)

    def _poll(self) -> bool:
        """One look; True once 99% of the file is cached."""
        n, t = self.cached(), time.time()
        if n and self.first is None:
            self.first = t
        if n >= 0.99 * self._size and self.full is None:
            self.full = t
        return self.full is not None

    def _run(self):
        while not self._stop.is_set() and not self._poll():
            self._stop.wait(self._every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        # A last look: a file read within the last interval (a small one, or
        # a fast start) is seen at the exit, not missed.
        self._poll()
        del self._anchor
        self._m.close()
        self._f.close()

    def rate(self) -> float:
        """Bytes per second from the first page to 99% cached (0 if it never was)."""
        if self.first is None or self.full is None:
            return 0.0
        return 0.99 * self._size / max(self.full - self.first, self._every)


def many_cold(peer: str, kind: str, size: str, path: str, files: List[str], n: int = 8,
              cold: bool = True, watch: dict = None) -> float:
    """P14: seconds from starting n workers together (cold cache; warm with
    cold=False) until the last answered. With `watch` (a dict), a cold start
    also puts there "read": its own read rate of the largest file
    (Residency), and "first": seconds from the eviction to that file's first
    page cached (how long the freed memory had to go back to the host)."""
    if cold:
        evict(files)
    else:
        warm_page_cache(files)
    evicted = time.time()
    biggest = max(files, key=os.path.getsize)
    with Residency(biggest) if cold and watch is not None else contextlib.nullcontext() as seen:
        t0 = time.time()
        ps = [spawn(peer, kind, size, path, threads=threads_per_worker(n)) for _ in range(n)]
        for p in ps:
            ready(p)
        elapsed = time.time() - t0
    if seen is not None:
        watch["read"] = seen.rate()
        watch["first"] = seen.first - evicted if seen.first is not None else 0.0
    for p in ps:
        p.stdin.close()
        p.wait()
    return elapsed


def pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss for {pid}")


def file_pss_kib(pid: int, files: List[str]) -> int:
    """Pss (KiB) of the process's mappings of `files` (/proc/PID/smaps): the
    model's own pages, whatever the rest of the process holds."""
    wanted = {os.path.realpath(f) for f in files}
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                inside = len(head) >= 6 and os.path.realpath(head[5]) in wanted
            elif inside and line.startswith("Pss:"):
                total += int(head[1])
    return total


def summed_pss(peer: str, kind: str, size: str, path: str, n: int = 8, files=()):
    """Summed Pss (KiB) of n workers that each hold the model, after one forward;
    with `files`, also the summed Pss of their mappings of those files."""
    ps = [spawn(peer, kind, size, path, hold=True, threads=threads_per_worker(n)) for _ in range(n)]
    try:
        for p in ps:
            ready(p)
            if peer != "meta" and p.stdout.readline().strip() != "HELD":
                raise RuntimeError(f"worker failed after its first output: {p.stderr.read()[-2000:]}")
        whole = sum(pss_kib(p.pid) for p in ps)
        return (whole, sum(file_pss_kib(p.pid, files) for p in ps)) if files else whole
    finally:
        for p in ps:
            p.stdin.close()
            p.wait()


# --- the worker -----------------------------------------------------------------------
def _since_exec() -> float:
    return time.time() - float(os.environ["TSAR_BENCH_T0"])


def worker(peer: str, kind: str, size: str, path: str, hold: bool, phases: bool = False) -> None:
    import torch  # noqa: F401  (part of what every loader pays)
    from peers import adapters, models

    spec = models.spec(kind, size)
    # A full collection of the garbage the imports left (about 0.1 s over
    # torch's and transformers' objects) happens at some allocation after
    # them: here, before anything is timed, in every worker and the floor
    # alike, not inside whichever loader's call it would otherwise fall in.
    gc.collect()
    if peer == "meta":  # the memory floor: torch imported, the architecture on meta
        spec.make(True)
        print(f"READY {_since_exec():.6f}", flush=True)
        sys.stdin.read()
        return
    adapter = adapters.by_name([peer])[0]
    x = spec.example_input()
    if adapter.builds_architecture:
        t_start = time.perf_counter()
        module = adapter.load(path, spec.make)
    else:
        module = spec.make(adapter.meta)
        gc.collect()  # the build's garbage too
        t_start = time.perf_counter()
        module = adapter.bind(path, module)  # the first use of the loader: its import too
    t_loaded = time.perf_counter()
    y = spec.forward(module, x)
    float(y.float().sum())  # the result exists
    t_output = time.perf_counter()
    print(f"READY {_since_exec():.6f}", flush=True)
    if phases:
        # The loader's own part of the first output, from this process alone:
        # LOAD (import of the loader + open + bind) and the first forward's
        # extra cost over the next one (the page faults a mapping defers to
        # first touch).
        y = spec.forward(module, x)
        float(y.float().sum())
        t_second = time.perf_counter()
        print(f"LOAD {t_loaded - t_start:.6f} FIRST {t_output - t_loaded:.6f} "
              f"SECOND {t_second - t_output:.6f}", flush=True)
    if hold:
        adapters.touch_every_page(module)  # what a worker serving requests ends up holding
        print("HELD", flush=True)
        sys.stdin.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("peer")
    w.add_argument("kind")
    w.add_argument("size")
    w.add_argument("path")
    w.add_argument("--hold", action="store_true")
    w.add_argument("--phases", action="store_true", help="a second forward, then LOAD/FIRST/SECOND")
    args = ap.parse_args()
    if args.cmd == "worker":
        worker(args.peer, args.kind, args.size, args.path, args.hold, args.phases)


if __name__ == "__main__":
    main()
