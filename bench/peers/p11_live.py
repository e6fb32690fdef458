"""P11, Python row (issue 31): tsar.LiveModule in a serving process.

For model (a), the ResNet-50, and (b), the 2 GiB LLaMA-style decoder of the
peers benchmark: serving threads (one, then one per core) call
``live.get()(x)`` without pause; a new version is published (tsar.save of the
same tensors to a temporary name, renamed over the path). Measured:

- rename to first request: from the moment the rename is done (tsar.save
  returned) to the first request that ran on the new version, and of that
  the model's own warm-up (one forward in ``warm_up``), reported apart;
  with ``verify="full"`` (the default: every checksum before a version
  serves) and ``verify="index"``;
- the longest request in the second around the swap, beside the longest in
  a second without one.

Run by run.py (measure "P11"): ``python bench/peers/run.py --only P11``.
"""
import os
import threading
import time

import torch


def _serve_and_swap(spec, path, state_dict, verify, threads, log):
    import tsar

    x = spec.example_input()
    events = []

    def make():
        return spec.make(True)

    def warm_up(m):
        spec.forward(m, x)

    live = tsar.LiveModule(path, make, warm_up=warm_up, verify=verify, poll_interval=1.0,
                           on_event=lambda e: events.append((time.perf_counter(), e)))
    lat = []  # (start, seconds, version)
    stop = threading.Event()
    lock = threading.Lock()

    def serve():
        with torch.inference_mode():
            while not stop.is_set():
                m, v = live.current()
                t0 = time.perf_counter()
                spec.forward(m, x)
                t1 = time.perf_counter()
                with lock:
                    lat.append((t0, t1 - t0, v))

    torch.set_num_threads(1)
    ts = [threading.Thread(target=serve) for _ in range(threads)]
    for t in ts:
        t.start()
    try:
        time.sleep(1.5)
        quiet_from = time.perf_counter()
        time.sleep(1.0)
        tmp = path + ".next"
        tsar.save(state_dict, tmp)
        os.replace(tmp, path)  # the publish
        renamed = time.perf_counter()
        deadline = renamed + 120
        while live.version < 2 and time.perf_counter() < deadline:
            time.sleep(0.0005)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in ts:
            t.join()
        live.close()
    first = min((s for s, d, v in lat if v == 2), default=None)  # the first request's start
    quiet = max((d for s, d, v in lat if quiet_from <= s < quiet_from + 1.0), default=0.0)
    around = max((d for s, d, v in lat if renamed - 0.5 <= s < renamed + 0.5), default=0.0)
    swap = [(t, e) for t, e in events if e.kind == "swapped"]
    at, e = swap[-1]
    return {
        "rename_to_first_ms": None if first is None else (first - renamed) * 1e3,
        "rename_to_serving_ms": (at - renamed) * 1e3,
        "make_ms": e.make_ms,
        "warm_up_ms": e.warm_up_ms,
        "tsar_ms": (at - renamed) * 1e3 - e.make_ms - e.warm_up_ms,
        "load_ms": e.load_ms,
        "longest_quiet_ms": quiet * 1e3,
        "longest_swap_ms": around * 1e3,
        "requests": len(lat),
    }


def p11(rep, srcs, workdir, log):
    import tsar

    rep.text("## P11 (Python): tsar.LiveModule, a new version published while threads serve")
    rows = []
    cores = os.cpu_count() or 1
    for kind in ("a", "b"):
        if kind not in srcs:
            continue
        src = srcs[kind]
        path = os.path.join(workdir, f"live-{kind}.tsar")
        tsar.save(src.state_dict, path)
        for verify in ("full", "index"):
            for threads in sorted({1, cores}):
                log(f"# P11 {kind} verify={verify} threads={threads}")
                r = _serve_and_swap(src.spec, path, src.state_dict, verify, threads, log)
                for k, v in r.items():
                    if v is not None:
                        rep.row("P11", kind, f"tsar.LiveModule verify={verify}", f"{threads} serving {k}",
                                f"{v:.3f}", "ms" if k.endswith("ms") else "")
                rows.append([kind, verify, threads, f"{r['rename_to_serving_ms']:.0f}",
                             f"{r['make_ms']:.0f}", f"{r['warm_up_ms']:.0f}", f"{r['tsar_ms']:.0f}",
                             f"{r['rename_to_first_ms']:.0f}",
                             f"{r['longest_quiet_ms']:.0f}", f"{r['longest_swap_ms']:.0f}"])
    rep.text("Serving threads call `live.current()` and one forward without pause (one torch thread "
             "each); after 2.5 s the same tensors are saved to a temporary name and renamed over the "
             "path. *rename to serving*: from the rename to the swap (the new version is what "
             "`current()` returns); of that, *make* (building the architecture on meta) and *warm-up* "
             "(one forward) are the model's own costs, *tsar's part* the rest (inotify wake-up, open, "
             "verify, bind); *rename to first request*: to the start of the first request on the new "
             "version (a thread takes it when its current request ends). Longest request: in a quiet "
             f"second, and in the second around the rename. {cores} cores.")
    rep.text()
    rep.table(["model", "verify", "serving threads", "rename to serving ms", "make ms", "warm-up ms",
               "tsar's part ms", "rename to first request ms", "longest request, quiet ms",
               "longest request, swap ms"], rows)
    rep.text()
