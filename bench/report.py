#!/usr/bin/python3
"""report.py --samples FILE --out DIR [--command CMD] [--load LOADAVG] [--data-fs FS]

Turns tsar_bench's samples (one CSV row per measurement) into the results of
bench/README.md: a table on stdout, DIR/results.csv (median, min, max, n and
the ratio to the peer for every row), DIR/report.md (machine, goals met or
missed and why, tables, charts) and DIR/p1_open_bind.png, p3_memory.png,
p4_cold.png (gnuplot). Only the standard library and gnuplot are needed.
"""
import argparse
import collections
import csv
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys

MIB = 1024 * 1024
ATTR = ": model-attributable"  # P3's derived rows

TITLES = {
    "P1": "P1. Warm open + bind",
    "P2": "P2. Time to the first output of resnet18",
    "P3": "P3. Memory of N processes holding the same 512 MiB model",
    "P4": "P4. Cold load, every byte read",
    "P5": "P5. Opening an index of 100,000 tensors",
    "P6": "P6. Packing 512 MiB",
    "P7": "P7. Verifying 512 MiB (warm)",
    "P8": "P8. Python: warm load of the 512 MiB model into a module",
    "P9": "P9. Python: 8 worker processes holding the same 512 MiB model",
    "P10": "P10. Four fine-tuned variants served at once: layers over one base against full archives",
    "P11": "P11. Hot swap: new versions renamed over a live server's archive (tsar::LiveModule)",
    "P16": "P16. The host half of a copy onto a GPU: the staging lane's fill, 512 MiB",
}

METHODS = {
    "P1": "Page cache warm, one untimed run first. tsar: `Archive::open` + `tsar::bind` into a module "
          "constructed beforehand (`torch::nn` with `torch::empty` parameters; resnet18: the TorchScript "
          "architecture). Peers: `read()` of the torch.save file + `torch::pickle_load` + `copy_` into "
          "the same kind of module; `torch::jit::load` of the scripted model (architecture and weights).",
    "P2": "Each run is a new process; the clock starts at `main()` with the input tensor ready, and "
          "stops when the output tensor exists. The issue's peer is `torch::jit::load` + forward. The "
          "architecture for tsar is (a) C++ code (`bench/resnet18.cc`, torchvision's names, `torch::empty` "
          "parameters, no initialisation) or (b) a TorchScript file whose weights are stride-0 views of "
          "one zero (90 KB: right shapes, no data). The goal is judged on (a), the issue's wording "
          "(\"open + bind + forward\"); (b) and a same-engine peer (C++ architecture + pickle_load) are "
          "shown so that the part of the gain that comes from not using TorchScript is visible.",
    "P3": "N processes started one after another, each loads the model and runs one forward (touching "
          "every weight), then waits; memory is summed over the N processes from `/proc/PID/smaps_rollup` "
          "and `/proc/PID/smaps` while exactly N are alive. A baseline group runs the same binary without "
          "a model: a process that links LibTorch costs memory of its own. Model-attributable = summed "
          "Pss of anonymous memory + summed Pss of mapped model files (tsar's archive), minus the "
          "baseline group's summed anonymous Pss at the same N. Shared-library pages (LibTorch's code) "
          "are left out of that difference: their Pss depends on which code paths each group happened "
          "to run and on who else maps LibTorch, which made `summed Pss - baseline summed Pss` drift by "
          "+-20 MiB between groups. The raw sums are in the table.",
    "P4": "Before every run: `sync`, `posix_fadvise(POSIX_FADV_DONTNEED)`, then `drop_caches` if pages "
          "remain; `mincore` checks that no page is resident before and that every page is resident "
          "after. tsar: `Archive::open` with the prefetch mode, then every 8-byte word of the mapping "
          "is read. Peer: `cat FILE > /dev/null`. Runs are interleaved; one untimed round first.",
    "P5": "Warm. tsar: `Archive::open` (header, index, every rule of the spec checked, name lookup "
          "ready). Peer: a safetensors file with the same 100,000 tensors: read the u64 size and the "
          "JSON header, `nlohmann::json::parse`, check every entry's dtype, shape and data_offsets "
          "against the file, build a name -> entry map (what a safetensors reader does). Open + every "
          "tensor: tsar `Archive::open(...).state_dict()` against that JSON read + mmap + `at::from_blob` of "
          "each tensor into the same `torch::OrderedDict`, in file order: a stand-in for the safetensors "
          "library's `{k: f.get_tensor(k) for k in f.keys()}`, which cannot be installed here (Debian has "
          "no package, and there is no PyPI).",
    "P6": "Input warm in the page cache, `sync` before each run so earlier writeback stays out of the "
          "clock. Throughput = bytes of the torch.save file / wall time. `tsar pack` always fsyncs, so "
          "its peer is `cp --reflink=never` + fsync of the copy; plain `cp` is shown too.",
    "P10": "The base is P3's 512 MiB stack (stack.tsar). Variant v changes weights 4v..4v+3 (1/8 of the "
           "bytes) and keeps the rest; it is packed in-process with `tsar::pack` twice: with "
           "`PackOptions::base` = stack.tsar (a layer) and without (a full archive). One process per "
           "variant binds it into the stack module and runs one forward (every weight page touched), then "
           "waits; with the four alive, the Pss of every mapped model file (layer, base or full archive) "
           "is summed from `/proc/PID/smaps`. Goal: layers <= 1.05 x (base + the variants' own bytes) + "
           "4 x 4 MiB; the variants' files together <= 1.05 x their own bytes.",
    "P11": "In-process, torch threads 1. Request threads call `LiveModule::current()` and forward without "
           "pause while 10 new versions are renamed over the served path, 400 ms apart (hard links of "
           "4 prepared archives). Per swap: the time from the rename to the end of the first request "
           "that ran on the new version. Latency: the longest request overlapping a swap's window "
           "(its rename + 150 ms: loading, publishing and releasing the old version) against the "
           "longest in as many 150 ms windows without a swap. `make` is `torch::jit::load` of the "
           "architecture file; `warm_up` runs two forwards (TorchScript profiles the first, compiles "
           "on the second). Cases: one request thread (a core free for loading), as many request "
           "threads as cores (none free), and that again with `loader_nice = 19`; resnet18 shows a "
           "model whose make + warm-up alone take hundreds of ms on this machine.",
    "P16": "In-process, any machine: `RunPipeline` (loader/device_pipeline.h, what `to_device` runs) over "
           "every storage of the 512 MiB archive, with a copy engine whose transfers finish at once, so "
           "only the host fill is timed: 64 MiB of pre-faulted buffers, 4 of them, filled by the staging "
           "rule's threads (every core up to 16) and by one. Each run opens the archive afresh (a fresh "
           "mapping, as a server's first load); the fill either reads the file (`pread`, loader/"
           "file_regions.h, `to_device`'s default) or copies out of the mapping (faulting its pages in). "
           "Warm: the file in the page cache; peer: the same staging over a mapping populated beforehand "
           "(`Prefetch::kPopulate`: the mapping path's ceiling). Cold: "
           "the file evicted before each run; peer: `cat` of the evicted file. A warm-up round first.",
    "P7": "Archive mapped with `Prefetch::kPopulate` and verified once before timing. "
          "`Archive::verify()` hashes every storage with XXH3-64; the peer copies the same mapped bytes "
          "into a pre-faulted buffer.",
    "P8": "bench/p8_python.py, /usr/bin/python3, one thread. The module (32 `nn.Linear(2048, 2048)`, parameters "
          "from `torch.empty` via `skip_init`) is built before timing. tsar: `tsar.open` + `tsar.load_into` "
          "(rebinds each Parameter in place). Peer: `torch.load` of the torch.save file + `load_state_dict` "
          "(copies into the module's own memory). One untimed run of each first; runs interleaved; the two "
          "modules' outputs are checked equal.",
    "P9": "bench/p8_python.py: 8 Python processes started one after another; each builds the module, loads "
          "the weights (tsar: `load_into` over a shared mapping; peer: `torch.load` + `load_state_dict`, the "
          "loaded dict then freed), runs one forward (every weight touched) and waits. Memory summed over the 8 "
          "from `/proc/PID/smaps_rollup` (Pss_Anon) and `/proc/PID/smaps` (Pss of the archive's mapping) while "
          "all 8 are alive. Model-attributable = that sum minus the summed Pss_Anon of 8 processes that build "
          "the module and load nothing (the baseline row)."
}


def load(path):
    groups = collections.OrderedDict()
    info = collections.OrderedDict()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["bench"] == "info":
                info[row["case"]] = row["value"]
                continue
            key = (row["bench"], row["case"], row["variant"], row["unit"])
            groups.setdefault(key, []).append(float(row["value"]))
    return groups, info


class Row:
    def __init__(self, bench, case, variant, unit, values, derived=False):
        self.bench, self.case, self.variant, self.unit = bench, case, variant, unit
        self.values = values
        self.median = statistics.median(values)
        self.min = min(values)
        self.max = max(values)
        self.n = len(values)
        self.derived = derived
        self.ratio = None
        self.ratio_text = ""


def fmt(v):
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    if a >= 1:
        return f"{v:.3f}"
    return f"{v:.4f}"


def build_rows(groups, info):
    rows = [Row(*k, v) for k, v in groups.items()]
    by = {(r.bench, r.case, r.variant, r.unit): r for r in rows}

    def get(bench, case, variant, unit):
        return by.get((bench, case, variant, unit))

    def speedup(tsar, peer):  # lower is better: peer / tsar
        if tsar and peer:
            peer.ratio = peer.median / tsar.median
            peer.ratio_text = f"tsar {peer.ratio:,.0f}x faster" if peer.ratio >= 10 else f"tsar {peer.ratio:.2f}x faster"

    def time_ratio(tsar, peer, name):  # the first peer given is the one in results.csv's ratio column
        if tsar and peer:
            if tsar.ratio is None:
                tsar.ratio = tsar.median / peer.median
            tsar.ratio_text = (tsar.ratio_text + "; " if tsar.ratio_text else "") + f"{tsar.ratio:.2f}x the time of {name}"

    def thr_ratio(tsar, peer, name):
        if tsar and peer:
            tsar.ratio = tsar.median / peer.median
            tsar.ratio_text = f"{tsar.ratio:.2f}x {name}"

    # P1
    for case in sorted({r.case for r in rows if r.bench == "P1"}):
        t = get("P1", case, "tsar open+bind", "ms")
        for r in rows:
            if r.bench == "P1" and r.case == case and r is not t:
                speedup(t, r)
    # P2
    for case in sorted({r.case for r in rows if r.bench == "P2"}):
        jit = get("P2", case, "torch::jit::load + forward", "ms")
        cpp = get("P2", case, "tsar: C++ architecture + open + bind + forward", "ms")
        pick = get("P2", case, "C++ architecture + torch::pickle_load + copy_ + forward", "ms")
        ts = get("P2", case, "tsar: jit::load(architecture, no weights) + open + bind + forward", "ms")
        time_ratio(cpp, jit, "jit::load + forward")
        time_ratio(cpp, pick, "C++ architecture + pickle_load")
        time_ratio(ts, jit, "jit::load + forward")
    # P3: model-attributable memory and the cost of one more process.
    base = "no model (baseline)"
    modes = [m for m in ["tsar", "torch::pickle_load + copy_", "torch::jit::load"]]
    ns = sorted({int(r.case[2:]) for r in rows if r.bench == "P3" and r.case.startswith("N=")})
    extra = []
    for n in ns:
        case = f"N={n}"
        b = get("P3", case, base, "MiB summed Pss_Anon")
        attributable = {}
        for m in modes:
            anon = get("P3", case, m, "MiB summed Pss_Anon")
            files = get("P3", case, m, "MiB summed Pss of mapped model files")
            if anon and files and b:
                a = Row("P3", case, m + ATTR, "MiB", [anon.median + files.median - b.median], True)
                attributable[m] = a
                extra.append(a)
        for m in modes[1:]:
            if m in attributable and "tsar" in attributable:
                p, t = attributable[m], attributable["tsar"]
                p.ratio = p.median / t.median
                p.ratio_text = f"{p.ratio:.2f}x tsar's"
    if ns:
        lo, hi = ns[0], ns[-1]
        for m in [base] + modes:
            a, z = get("P3", f"N={lo}", m, "MiB summed Pss"), get("P3", f"N={hi}", m, "MiB summed Pss")
            if a and z:
                extra.append(Row("P3", f"one more process (N={lo}->{hi})", f"{m}: added summed Pss per process", "MiB",
                                 [(z.median - a.median) / (hi - lo)], True))
        more = {r.variant.rsplit(": added", 1)[0]: r for r in extra if r.case.startswith("one more")}
        for m, r in more.items():
            if m == base or base not in more:
                continue
            r.ratio_text = f"+{fmt(r.median - more[base].median)} MiB over a process without a model"
            if m != "tsar" and "tsar" in more:
                r.ratio = r.median / more["tsar"].median
                r.ratio_text += f"; {r.ratio:.1f}x tsar's"
    rows += extra
    for r in extra:
        by[(r.bench, r.case, r.variant, r.unit)] = r
    # P4
    cat = get("P4", "512 MiB, cold", "cat FILE > /dev/null", "GB/s")
    for r in rows:
        if r.bench == "P4" and r.variant.startswith("tsar"):
            thr_ratio(r, cat, "cat's throughput")
    # P5
    speedup(get("P5", "100000 tensors", "tsar Archive::open", "ms"),
            get("P5", "100000 tensors", "JSON header (nlohmann-json)", "ms"))
    speedup(get("P5", "100000 tensors, open + every tensor", "tsar Archive::open + state_dict()", "ms"),
            get("P5", "100000 tensors, open + every tensor", "JSON header + from_blob views", "ms"))
    # P6
    cp = get("P6", "512 MiB", "cp + fsync", "GB/s")
    for r in rows:
        if r.bench == "P6" and r.variant.startswith("tsar") and r.unit == "GB/s":
            thr_ratio(r, cp, "cp + fsync")
    # P7
    thr_ratio(get("P7", "512 MiB, warm", "tsar verify (XXH3-64)", "GB/s"),
              get("P7", "512 MiB, warm", "memcpy (pre-faulted destination)", "GB/s"), "memcpy")
    # P16: each staging variant against the faulted-in memcpy (warm) or cat (cold)
    rule = next((r.variant.split(", ")[-1] for r in rows if r.bench == "P16"
                 and r.variant.startswith("staging copied from a mapping already faulted in")), "")
    for case, peer_name, label in (("512 MiB, warm", "staging copied from a mapping already faulted in, " + rule,
                                    "the faulted-in mapping"),
                                   ("512 MiB, cold", "cat FILE > /dev/null", "cat")):
        peer = get("P16", case, peer_name, "GB/s")
        for r in rows:
            if r.bench == "P16" and r.case == case and r.variant.startswith("tsar"):
                thr_ratio(r, peer, label)
    # P8, P9
    speedup(get("P8", "512 MiB, 64 tensors, warm", "tsar.open + tsar.load_into", "ms"),
            get("P8", "512 MiB, 64 tensors, warm", "torch.load + load_state_dict", "ms"))
    for r in rows:
        if r.bench == "P9" and r.variant.startswith("torch.load"):
            t = get("P9", r.case, r.variant.replace("torch.load + load_state_dict", "tsar.load_into"), r.unit)
            if t:
                r.ratio = r.median / t.median
                r.ratio_text = f"{r.ratio:.1f}x tsar's"
    order = {b: i for i, b in enumerate(TITLES)}
    rows.sort(key=lambda r: order.get(r.bench, 99))  # stable: keeps the run's order inside a bench
    return rows, get


class Goal:
    def __init__(self, bench, text, target, measured, met, why=""):
        self.bench, self.text, self.target, self.measured, self.met, self.why = bench, text, target, measured, met, why


def goals(rows, get, info):
    out = []

    def per_tensor_why(r, n):
        o = get("P5", "100000 tensors", "tsar Archive::open", "ms")
        bind_ms = r.median - o.median if o else None
        return (f"{r.median * 1000 / n:.2f} us per tensor. Archive::open alone takes "
                f"{fmt(o.median) if o else '?'} ms of it (P5); the rest, "
                f"{fmt(bind_ms) if bind_ms is not None else '?'} ms, is bind: per tensor a hash lookup of its "
                f"name (skipped when the module lists tensors in archive order), a new c10::StorageImpl, and "
                f"the module's TensorImpl and its previous storage, each a cache miss on a heap of 100,000 "
                f"tensors (prefetched a few slots ahead).")
    model_bytes = 32 * (2048 * 2048 + 2048) * 4
    # P1
    t = get("P1", "512 MiB, 64 tensors", "tsar open+bind", "ms")
    for peer in ["torch::pickle_load + copy_", "torch::jit::load"]:
        p = get("P1", "512 MiB, 64 tensors", peer, "ms")
        if t and p:
            why = ""
            if p.ratio < 1000:
                thr = float(info.get("bytes.stack_ts.pt", 0)) / (p.median / 1000) / 1e9
                why = (f"{peer} reads the 512 MiB file at {thr:.1f} GB/s ({fmt(p.median)} ms, close to what a "
                       f"read() into fresh memory can do here), and tsar's {fmt(t.median)} ms are fixed system-call "
                       f"costs (open, pread of the index, mmap, one set_ per tensor); the ratio is bounded by "
                       f"the peer's copy speed, not by anything tsar does per byte.")
            out.append(Goal("P1", f"open+bind at 512 MiB >= 1000x faster than {peer}", ">= 1000x",
                            f"{p.ratio:,.0f}x ({fmt(t.median)} ms vs {fmt(p.median)} ms)", p.ratio >= 1000, why))
    for case, n in [("512 MiB, 64 tensors", 64), ("resnet18, 122 tensors", 122), ("100000 tensors", 100000)]:
        r = get("P1", case, "tsar open+bind", "ms")
        if not r:
            continue
        bound = 1 + 0.002 * n
        why = ""
        if r.median > bound:
            why = per_tensor_why(r, n)
        out.append(Goal("P1", f"open+bind of {case} <= 1 ms + 2 us x {n:,}", f"<= {bound:,.3f} ms",
                        f"{fmt(r.median)} ms", r.median <= bound, why))
    r = get("P1", "100000 tensors", "tsar open+bind", "ms")
    if r:
        out.append(Goal("P1", "open+bind of 100,000 tensors <= 50 ms (issue 11)", "<= 50 ms", f"{fmt(r.median)} ms",
                        r.median <= 50, per_tensor_why(r, 100000) if r.median > 50 else ""))
    # P2
    for case in sorted({r.case for r in rows if r.bench == "P2"}):
        cpp = get("P2", case, "tsar: C++ architecture + open + bind + forward", "ms")
        jit = get("P2", case, "torch::jit::load + forward", "ms")
        fw = get("P2", case, "  tsar, C++: first forward", "ms")
        ts = get("P2", case, "tsar: jit::load(architecture, no weights) + open + bind + forward", "ms")
        if cpp and jit:
            why = ""
            ratio = cpp.median / jit.median
            if ratio > 0.5:
                why = (f"the first forward alone takes {fmt(fw.median) if fw else '?'} ms, "
                       f"{(fw.median / jit.median) if fw else 0:.2f}x of the peer's whole time: no loader can "
                       f"reach 0.5x at this input size on this machine.")
            out.append(Goal("P2", f"{case}: tsar open + bind + forward (C++ architecture) <= 0.5x jit::load + forward", "<= 0.5x",
                            f"{ratio:.2f}x ({fmt(cpp.median)} vs {fmt(jit.median)} ms)", ratio <= 0.5, why))
    # P3
    for r in rows:
        if r.bench == "P3" and r.variant == "tsar" + ATTR:
            n = int(r.case[2:])
            bound = 1.05 * model_bytes / MIB + 4 * n
            raw = get("P3", r.case, "tsar", "MiB summed Pss")
            why = "" if r.median <= bound else "see the P3 table: compare the Pss of the mapped archive with the anonymous memory the tsar processes hold beyond the baseline's."
            out.append(Goal("P3", f"tsar, N={n}: model-attributable summed Pss <= 1.05 x model + N x 4 MiB",
                            f"<= {bound:,.1f} MiB", f"{fmt(r.median)} MiB (raw sum {fmt(raw.median) if raw else '?'} MiB)",
                            r.median <= bound, why))
    # P4
    cat = get("P4", "512 MiB, cold", "cat FILE > /dev/null", "GB/s")
    for r in rows:
        if r.bench == "P4" and r.variant.startswith("tsar") and cat:
            why = ""
            if r.ratio < 0.9:
                if "populate" in r.variant:
                    why = ("MAP_POPULATE faults the file in synchronously inside mmap(); the kernel reads it with "
                           "its page-fault read-ahead, not with the large sequential requests cat's read() "
                           "gets. prefetch=willneed (asynchronous read-ahead of the whole file) is the mode "
                           "to use for cold starts.")
                elif "none" in r.variant:
                    why = ("pages come in on first touch: a fault on a missing page starts a read-ahead "
                           "window and the reader waits for it, while cat's sequential read() calls keep the "
                           "kernel's asynchronous read-ahead running ahead of the reader. Open cold archives "
                           "with Prefetch::kWillNeed.")
                else:
                    why = "the read-ahead started by madvise(MADV_WILLNEED) did not keep ahead of the reader."
            out.append(Goal("P4", f"cold load with {r.variant.replace('tsar ', '')} >= 0.9x cat", ">= 0.9x",
                            f"{r.ratio:.2f}x ({fmt(r.median)} vs {fmt(cat.median)} GB/s)", r.ratio >= 0.9, why))
    # P5
    t = get("P5", "100000 tensors", "tsar Archive::open", "ms")
    j = get("P5", "100000 tensors", "JSON header (nlohmann-json)", "ms")
    if t and j:
        why = ""
        if t.median > 20 or j.ratio < 5:
            why = (f"{t.median * 1000 / 100000:.2f} us per tensor for decoding and checking every index "
                   f"record (format/index.cc) and setting up the per-tensor state (loader/archive.cc).")
        out.append(Goal("P5", "open of 100,000 tensors <= 20 ms", "<= 20 ms", f"{fmt(t.median)} ms", t.median <= 20,
                        why))
        out.append(Goal("P5", "open >= 5x faster than the JSON index", ">= 5x", f"{j.ratio:.2f}x", j.ratio >= 5,
                        why and "same cause as above; the JSON parse itself takes " + fmt(j.median) + " ms."))
    t = get("P5", "100000 tensors, open + every tensor", "tsar Archive::open + state_dict()", "ms")
    v = get("P5", "100000 tensors, open + every tensor", "JSON header + from_blob views", "ms")
    if t and v:
        why = ("per tensor: a StorageImpl, a TensorImpl and an insertion into torch::OrderedDict's hash index "
               "(about a third of the time: two cache misses per insert).")
        out.append(Goal("P5", "open + state_dict() of 100,000 tensors <= 0.5x the safetensors stand-in (issue 11)",
                        "<= 0.5x", f"{t.median / v.median:.2f}x ({fmt(t.median)} vs {fmt(v.median)} ms)",
                        t.median <= 0.5 * v.median, "" if t.median <= 0.5 * v.median else why))
        out.append(Goal("P5", "open + state_dict() of 100,000 tensors <= 45 ms (half the ~90 ms issue 11 measured "
                        "for the real safetensors library, on its machine)", "<= 45 ms", f"{fmt(t.median)} ms",
                        t.median <= 45, "" if t.median <= 45 else why))
    # P6
    p = get("P6", "512 MiB", "tsar pack (CLI: process start, import, hash, write, fsync)", "GB/s")
    api = get("P6", "512 MiB", "tsar::pack() in-process from mapped tensors (fsync)", "GB/s")
    start = get("P6", "512 MiB", "tsar --version (process start only)", "ms")
    if p:
        why = ""
        if p.ratio < 0.9:
            bytes_ = float(info.get("bytes.stack_sd.pt", 0))
            secs = bytes_ / (p.median * 1e9)
            why = (f"`tsar pack` spends {fmt(start.median) if start else '?'} ms "
                   f"({(start.median / 1000 / secs * 100) if start else 0:.0f}% of its {secs:.2f} s) starting "
                   f"(`tsar --version` alone), and it reads the input through a mapping and hashes it (XXH3) "
                   f"on the way, where cp copies with copy_file_range. In-process, tsar::pack() writes at "
                   f"{fmt(api.median) if api else '?'} GB/s = {api.ratio if api else 0:.2f}x cp + fsync.")
        out.append(Goal("P6", "tsar pack >= 0.9x cp's throughput (both durable)", ">= 0.9x",
                        f"{p.ratio:.2f}x ({fmt(p.median)} vs {fmt(get('P6', '512 MiB', 'cp + fsync', 'GB/s').median)} GB/s)",
                        p.ratio >= 0.9, why))
    anon = get("P6", "512 MiB", "tsar pack peak anonymous memory (RssAnon)", "MiB")
    if anon:
        out.append(Goal("P6", "tsar pack of 512 MiB: peak anonymous memory < 64 MiB (the input is mapped)",
                        "< 64 MiB", f"{fmt(anon.max)} MiB (largest sample of any run)", anon.max < 64, ""))
    inspect = get("P6", "resnet18", "tsar inspect (whole process)", "ms")
    if inspect:
        out.append(Goal("P6", "start-up: `tsar inspect` of resnet18's archive, whole process <= 15 ms", "<= 15 ms",
                        f"{fmt(inspect.median)} ms", inspect.median <= 15,
                        "" if inspect.median <= 15 else "see `tsar --version`: the dynamic loader's share."))
    # P10
    layers = get("P10", "4 variants", "layers over stack.tsar: summed Pss of model files", "MiB")
    bound = get("P10", "4 variants", "goal: 1.05 x (base + own bytes) + 4 x 4 MiB", "MiB")
    full = get("P10", "4 variants", "4 full archives: summed Pss of model files", "MiB")
    if layers and bound:
        out.append(Goal("P10", "4 variants as layers: summed Pss of model files <= 1.05 x (base + own) + 16 MiB",
                        f"<= {fmt(bound.median)} MiB",
                        f"{fmt(layers.median)} MiB (4 full archives: {fmt(full.median) if full else '?'} MiB)",
                        layers.median <= bound.median, ""))
    disk = get("P10", "4 variants", "layers: the variants' files on disk", "MiB")
    own = get("P10", "4 variants", "layers: the variants' own bytes", "MiB")
    if disk and own:
        out.append(Goal("P10", "the variants' files on disk <= 1.05 x their own bytes", f"<= {fmt(1.05 * own.median)} MiB",
                        f"{fmt(disk.median)} MiB", disk.median <= 1.05 * own.median, ""))
    # P11: the goals hold per case; the MLP's, whose requests are short enough to see a swap's cost.
    for case in sorted({r.case for r in rows if r.bench == "P11"}):
        serve = get("P11", case, "rename to the first request served by the new version", "ms")
        added = get("P11", case, "what a swap added to the longest request", "ms")
        if serve:
            out.append(Goal("P11", f"{case}: the new version serves within 50 ms of the rename", "<= 50 ms",
                            f"{fmt(serve.max)} ms (slowest of {serve.n} swaps; median {fmt(serve.median)})",
                            serve.max <= 50, "" if serve.max <= 50 else "make (torch::jit::load) and warm_up take the CPU time; see the loader row."))
        if added:
            out.append(Goal("P11", f"{case}: a swap adds under 1 ms to the longest request", "< 1 ms",
                            f"{fmt(added.median)} ms", added.median < 1,
                            "" if added.median < 1 else "every core serves requests, so loading the new version takes CPU from them."))
    # P7
    v = get("P7", "512 MiB, warm", "tsar verify (XXH3-64)", "GB/s")
    if v:
        why = "" if v.ratio >= 0.5 else "XXH3-64 from the shared libxxhash (no -march=native) runs below memcpy speed."
        out.append(Goal("P7", "verify >= 0.5x memcpy bandwidth", ">= 0.5x", f"{v.ratio:.2f}x ({fmt(v.median)} GB/s)",
                        v.ratio >= 0.5, why))
    # P8
    peer = get("P8", "512 MiB, 64 tensors, warm", "torch.load + load_state_dict", "ms")
    t = get("P8", "512 MiB, 64 tensors, warm", "tsar.open + tsar.load_into", "ms")
    if t and peer:
        why = "" if peer.ratio >= 100 else (
            f"tsar's {fmt(t.median)} ms are Python-level costs (state_dict(keep_vars=True), argument conversion "
            f"of 64 tensors) on top of the C++ open+bind measured in P1.")
        out.append(Goal("P8", "Python open + load_into >= 100x faster than torch.load + load_state_dict", ">= 100x",
                        f"{peer.ratio:,.0f}x ({fmt(t.median)} ms vs {fmt(peer.median)} ms)", peer.ratio >= 100, why))
    # P9
    for r in rows:
        if r.bench == "P9" and r.variant == "tsar.load_into: model-attributable":
            limit = (1.05 * model_bytes + 8 * 4 * MIB) / MIB
            why = "" if r.median <= limit else (
                "each Python worker's private memory grows with the model (copies of weights somewhere).")
            out.append(Goal("P9", "8 Python workers: model-attributable summed Pss <= 1.05 x model + 8 x 4 MiB",
                            f"<= {fmt(limit)} MiB", f"{fmt(r.median)} MiB", r.median <= limit, why))
    return out


def machine(args):
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    model = next((l.split(":", 1)[1].strip() for l in read("/proc/cpuinfo").splitlines() if l.startswith("model name")), "?")
    mem_kb = next((int(l.split()[1]) for l in read("/proc/meminfo").splitlines() if l.startswith("MemTotal")), 0)

    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return collections.OrderedDict([
        ("CPU", f"{os.cpu_count()} cores, {model}"),
        ("RAM", f"{mem_kb / 1024 / 1024:.1f} GiB"),
        ("Kernel", f"{platform.system()} {platform.release()}"),
        ("Virtualisation", run(["systemd-detect-virt"]) or "?"),
        ("Data directory file system", args.data_fs or "?"),
        ("Load average at start", args.load or "?"),
        ("LibTorch", run(["dpkg-query", "-W", "-f=${Version}", "libtorch-dev"]) or "?"),
        ("Compiler", (run(["c++", "--version"]).splitlines() or ["?"])[0]),
    ])


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["bench", "case", "variant", "unit", "n", "median", "min", "max", "ratio", "vs_peer"])
        for r in rows:
            w.writerow([r.bench, r.case, r.variant, r.unit, r.n, f"{r.median:.6g}", f"{r.min:.6g}", f"{r.max:.6g}",
                        "" if r.ratio is None else f"{r.ratio:.6g}", r.ratio_text])


def table_text(rows):
    lines = []
    w = max([len(r.variant) for r in rows if r.bench != "P3"] or [10])
    bench = None
    for r in rows:
        if r.bench == "P3":
            if bench != "P3":
                bench = "P3"
                lines.append("")
                lines.append(TITLES["P3"])
                lines.extend("  " + l for l in p3_pivot(rows))
            continue
        if r.bench != bench:
            bench = r.bench
            lines.append("")
            lines.append(TITLES.get(bench, bench))
        stats = f"{fmt(r.median):>10} {fmt(r.min):>10} {fmt(r.max):>10}" if r.n > 1 else f"{fmt(r.median):>10} {'':>10} {'':>10}"
        lines.append(f"  {r.case:<28} {r.variant:<{w}} {stats} {r.unit:<24} n={r.n:<3} {r.ratio_text}")
    return "\n".join(lines)


def gnuplot(script, out_png):
    if not shutil.which("gnuplot"):
        print(f"report: gnuplot not found, {out_png} not drawn", file=sys.stderr)
        return False
    subprocess.run(["gnuplot"], input=f"set terminal pngcairo noenhanced size 960,540 font 'sans,10'\nset output '{out_png}'\n{script}",
                   text=True, check=True)
    return True


def quote(s):
    return '"' + s.replace('"', "'") + '"'


def chart_p1(rows, get, out):
    cases = [c for c in ["512 MiB, 64 tensors", "resnet18, 122 tensors"] if get("P1", c, "tsar open+bind", "ms")]
    variants = ["tsar open+bind", "torch::pickle_load + copy_", "torch::jit::load"]
    data = "\n".join(quote(c) + " " + " ".join(f"{get('P1', c, v, 'ms').median:.6g}" if get("P1", c, v, "ms") else "NaN"
                                               for v in variants) for c in cases)
    script = f"""$data << EOD
{data}
EOD
set title "P1: warm open + bind vs loading the weights (median, ms, log scale; lower is better)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set logscale y
set yrange [0.01:*]
set ylabel "ms"
set grid ytics
set key outside top center horizontal
plot $data using 2:xtic(1) title "tsar open+bind" lc rgb "#1b9e77", \\
     '' using 3 title "torch::pickle_load + copy_" lc rgb "#d95f02", \\
     '' using 4 title "torch::jit::load" lc rgb "#7570b3"
"""
    return gnuplot(script, out)


def chart_p3(rows, get, out):
    ns = sorted({int(r.case[2:]) for r in rows if r.bench == "P3" and r.case.startswith("N=")})
    modes = ["tsar", "torch::pickle_load + copy_", "torch::jit::load"]
    model = 32 * (2048 * 2048 + 2048) * 4 / MIB
    lines = []
    for n in ns:
        vals = []
        for m in modes:
            r = get("P3", f"N={n}", m + ATTR, "MiB")
            vals.append(f"{r.median:.6g}" if r else "NaN")
        b = get("P3", f"N={n}", "no model (baseline)", "MiB summed Pss")
        vals.append(f"{1.05 * model + 4 * n:.6g}")
        vals.append(f"{b.median:.6g}" if b else "NaN")
        lines.append(f"{n} " + " ".join(vals))
    script = f"""$data << EOD
{chr(10).join(lines)}
EOD
set title "P3: memory of N processes holding the same 512 MiB model (summed Pss)"
set xlabel "processes (N)"
set ylabel "MiB"
set xtics (1, 2, 4, 8)
set grid
set key top left
plot $data using 1:2 with linespoints lw 2 pt 7 lc rgb "#1b9e77" title "tsar (model-attributable)", \\
     '' using 1:3 with linespoints lw 2 pt 5 lc rgb "#d95f02" title "torch::pickle_load + copy_ (model-attributable)", \\
     '' using 1:4 with linespoints lw 2 pt 9 lc rgb "#7570b3" title "torch::jit::load (model-attributable)", \\
     '' using 1:5 with lines dt 2 lw 2 lc rgb "#1b9e77" title "goal: 1.05 x model + N x 4 MiB", \\
     '' using 1:6 with linespoints dt 3 lc rgb "#666666" title "baseline: N processes with LibTorch, no model (not subtracted)"
"""
    return gnuplot(script, out)


def chart_p4(rows, get, out):
    variants = ["cat FILE > /dev/null", "tsar prefetch=none", "tsar prefetch=willneed", "tsar prefetch=populate"]
    got = [(v, get("P4", "512 MiB, cold", v, "GB/s")) for v in variants]
    got = [(v, r) for v, r in got if r]
    if not got:
        return False
    cat = got[0][1].median
    data = "\n".join(f"{i} {quote(v)} {r.median:.6g} {r.min:.6g} {r.max:.6g}" for i, (v, r) in enumerate(got))
    script = f"""$data << EOD
{data}
EOD
set title "P4: cold load of 512 MiB, every byte read (median with min-max; higher is better)"
set ylabel "GB/s"
set yrange [0:*]
set xrange [-0.6:{len(got) - 0.4}]
set style fill solid 0.9 border -1
set boxwidth 0.6
set grid ytics
set key top right
plot $data using 1:3:xtic(2) with boxes lc rgb "#1b9e77" title "median", \\
     '' using 1:3:4:5 with yerrorbars lc rgb "black" pt 7 ps 0 title "min-max", \\
     {0.9 * cat:.6g} with lines dt 2 lw 2 lc rgb "#d95f02" title "goal: 0.9 x cat"
"""
    return gnuplot(script, out)


def p2_notes(get):
    """What the P2 numbers say beyond the goal, computed from them."""
    try:
        return p2_notes_or_raise(get)
    except AttributeError:  # a row is missing (a partial run): no notes
        return []


def p2_notes_or_raise(get):
    out = []
    for case in ["resnet18, 1x3x224x224"]:
        g = lambda v: get("P2", case, v, "ms")
        jit, cpp, ts, pick = (g("torch::jit::load + forward"), g("tsar: C++ architecture + open + bind + forward"),
                              g("tsar: jit::load(architecture, no weights) + open + bind + forward"),
                              g("C++ architecture + torch::pickle_load + copy_ + forward"))
        if not (jit and cpp and ts and pick):
            continue
        arch = g("  tsar, TorchScript: jit::load(architecture, no weights)")
        jl = g("  jit: torch::jit::load")
        f_cpp, f_pick, f_jit = g("  tsar, C++: first forward"), g("  pickle, C++: first forward"), g("  jit: first forward")
        s_cpp, s_pick, s_jit = (g("  tsar, C++: steady-state forward (best of 3 more; not in the total)"),
                                g("  pickle, C++: steady-state forward (best of 3 more; not in the total)"),
                                g("  jit: steady-state forward (best of 3 more; not in the total)"))
        start = g("process start before main() (LibTorch loading; not in any total)")
        out.append(f"- Same engine, eager C++: tsar {fmt(cpp.median)} ms vs pickle_load + copy_ {fmt(pick.median)} ms "
                   f"({cpp.median / pick.median:.2f}x). Same engine, TorchScript: tsar with a weightless "
                   f"TorchScript architecture {fmt(ts.median)} ms vs jit::load {fmt(jit.median)} ms "
                   f"({ts.median / jit.median:.2f}x): jit::load of the 90 KB architecture alone takes "
                   f"{fmt(arch.median)} ms of the peer's {fmt(jl.median)} ms jit::load (TorchScript deserialises "
                   f"and compiles the model's code), so tsar saves only the weights' share of it.")
        if f_cpp.median > 1.05 * f_pick.median:
            first = ("the C++ first forward over tsar weights is slower than over copied weights, likely because "
                     "it pays the page faults of the mapping and the first touch of fresh activation memory, "
                     "which the copy path had already paid while loading.")
        elif f_cpp.median < f_pick.median / 1.05:
            first = "the C++ first forward over tsar weights was faster than over copied weights in this run."
        else:
            first = "the C++ first forward costs about the same over tsar weights as over copied weights."
        out.append(f"- First forward: {fmt(f_cpp.median)} ms (C++, tsar weights), {fmt(f_pick.median)} ms (C++, "
                   f"copied weights), {fmt(f_jit.median)} ms (TorchScript); steady state: {fmt(s_cpp.median)}, "
                   f"{fmt(s_pick.median)}, {fmt(s_jit.median)} ms. Part of the C++ variant's lead over the "
                   f"issue's peer is TorchScript's slower first run ({fmt(f_jit.median - f_cpp.median)} ms), not "
                   f"loading; " + first)
        if start:
            out.append(f"- Process start (LibTorch loading, {fmt(start.median)} ms) precedes every variant. "
                       f"Counted in, the goal's ratio is {(cpp.median + start.median) / (jit.median + start.median):.2f}x.")
    return out


def p3_pivot(rows):
    """P3 as one line per (variant, unit) and one column per N, then the
    cost of one more process."""
    ns = sorted({int(r.case[2:]) for r in rows if r.bench == "P3" and r.case.startswith("N=")})
    keys = []
    cells = {}
    for r in rows:
        if r.bench == "P3" and r.case.startswith("N="):
            k = (r.variant, r.unit)
            if k not in cells:
                keys.append(k)
                cells[k] = {}
            cells[k][int(r.case[2:])] = r
    out = ["| variant | unit | " + " | ".join(f"N={n}" for n in ns) + " |",
           "|---|---|" + "---:|" * len(ns)]
    for k in keys:
        vals = []
        for n in ns:
            r = cells[k].get(n)
            vals.append("" if r is None else fmt(r.median) + (f" ({r.ratio_text})" if r.ratio_text else ""))
        out.append(f"| {k[0]} | {k[1]} | " + " | ".join(vals) + " |")
    extra = [r for r in rows if r.bench == "P3" and not r.case.startswith("N=")]
    if extra:
        out.append("")
        out.append(f"| what one more process adds ({extra[0].case.split('(')[-1].rstrip(')')}: increase of the summed Pss per process) | MiB | |")
        out.append("|---|---:|---|")
        for r in extra:
            out.append(f"| {r.variant.replace(': added summed Pss per process', '')} | {fmt(r.median)} | {r.ratio_text} |")
    return out


def markdown(rows, get, gs, info, mach, args, charts):
    out = []
    # When the samples were written, so that re-running report.py alone keeps the date.
    now = datetime.datetime.fromtimestamp(os.path.getmtime(args.samples), datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")
    out.append("# tsar benchmarks\n")
    out.append(f"Measured by `{args.command or 'bench/run.sh'}` on {now}"
               + (f", commit `{args.commit}`" if args.commit else "") + ". "
               "Every number below was measured in this one run, tsar and its peers on the same files. "
               "Raw samples: [samples.csv](samples.csv); summary: [results.csv](results.csv). "
               "How it works: [../README.md](../README.md).\n")
    out.append("## Machine\n")
    out.append("| | |\n|---|---|")
    for k, v in mach.items():
        out.append(f"| {k} | {v} |")
    out.append(f"| LibTorch intra-op threads | {info.get('torch_threads', '?')} |")
    out.append("")
    met = sum(g.met for g in gs)
    out.append(f"## Goals: {met} of {len(gs)} met\n")
    out.append("| | goal | target | measured |\n|---|---|---|---|")
    for g in gs:
        out.append(f"| {'met' if g.met else '**missed**'} | {g.bench}: {g.text} | {g.target} | {g.measured} |")
    missed = [g for g in gs if not g.met]
    if missed:
        out.append("\nWhy the missed goals were missed (likely causes):\n")
        for g in missed:
            out.append(f"- **{g.bench}: {g.text}** ({g.measured}): {g.why or 'no explanation recorded.'}")
    out.append("")
    out.append("## Checks\n")
    checks = [
        ("P1: the bound and the copied 512 MiB models give the same output", info.get("P1.stack_same_output")),
        ("P2: all four ways of loading resnet18 give the same output (sum of logits)", info.get("P2.same_output.224")),
        ("P4: pages still cached when a cold run started (summed over runs)", info.get("P4.pages_not_evicted")),
        ("P4: pages not read by the end of a run (summed over runs)", info.get("P4.pages_not_read")),
        ("P5: tensors in the archive / in the JSON header",
         f"{info.get('P5.tsar_tensors', '?')} / {info.get('P5.json_tensors', '?')} "
         f"(JSON header {int(info.get('P5.json_header_bytes', 0)):,} bytes)" if "P5.tsar_tensors" in info else None),
    ]
    for k, v in checks:
        if v is not None:
            out.append(f"- {k}: {v}")
    sizes = [(k[6:], int(v)) for k, v in info.items() if k.startswith("bytes.")]
    if sizes:
        out.append("- Input files: " + ", ".join(f"{n} {b:,} B" for n, b in sizes))
    secs = [(k[:-8], float(v)) for k, v in info.items() if k.endswith(".seconds")]
    if secs:
        out.append("- Time per benchmark: " + ", ".join(f"{k} {v:.0f} s" for k, v in secs)
                   + f" (total {sum(v for _, v in secs):.0f} s)")
    out.append("")
    bench = None
    for r in rows:
        if r.bench == "P3":
            if bench != "P3":
                bench = "P3"
                out.append(f"## {TITLES['P3']}\n")
                out.append(METHODS["P3"] + "\n")
                if "P3" in charts:
                    out.append(f"![{TITLES['P3']}]({charts['P3']})\n")
                out.extend(p3_pivot(rows))
                out.append("")
            continue
        if r.bench != bench:
            bench = r.bench
            out.append(f"## {TITLES.get(bench, bench)}\n")
            out.append(METHODS.get(bench, "") + "\n")
            if bench in charts:
                out.append(f"![{TITLES[bench]}]({charts[bench]})\n")
            out.append("| case | variant | median | min | max | unit | n | vs peer |")
            out.append("|---|---|---:|---:|---:|---|---:|---|")
        name = r.variant.strip()
        if r.variant.startswith("  "):
            name = "&nbsp;&nbsp;" + name
        if r.n > 1:
            out.append(f"| {r.case} | {name} | {fmt(r.median)} | {fmt(r.min)} | {fmt(r.max)} | {r.unit} | {r.n} | {r.ratio_text} |")
        else:
            out.append(f"| {r.case} | {name} | {fmt(r.median)} | | | {r.unit} | {r.n}{' (derived)' if r.derived else ''} | {r.ratio_text} |")
        nxt = rows[rows.index(r) + 1] if rows.index(r) + 1 < len(rows) else None
        if nxt is None or nxt.bench != bench:
            out.append("")
            if bench == "P2":
                out.extend(p2_notes(get))
                out.append("")
    out.append("## Caveats\n")
    out.append("- A 2-core VM: one core runs the measurement, the other whatever else the machine does; "
               "run-to-run spread is in the min and max columns. P3 is one sample per N (memory, not time).")
    out.append("- \"Cold\" (P4) means not in this VM's page cache; the host may still cache the disk image, so "
               "`cat` measures the virtual disk as this VM sees it, which is the fair peer for the same file.")
    out.append("- P2 excludes the start of the process (dynamic loading and static initialisation of LibTorch, "
               "shown as its own row), which every variant pays alike; including it moves every ratio towards 1.")
    out.append("- A first forward also pays one-time costs (page faults on freshly mapped weights, first touch "
               "of new activation memory, which is slow in this VM); the steady-state rows show that the "
               "forward itself costs the same whichever loader provided the weights.")
    out.append("- P6's `tsar pack` is the whole command a user runs, process start included (no LibTorch "
               "since issue 13); the `tsar --version` row isolates that start.")
    out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("--commit", default="")
    ap.add_argument("--load", default="")
    ap.add_argument("--data-fs", default="")
    args = ap.parse_args()
    groups, info = load(args.samples)
    rows, get = build_rows(groups, info)
    gs = goals(rows, get, info)
    os.makedirs(args.out, exist_ok=True)
    write_csv(rows, os.path.join(args.out, "results.csv"))
    charts = {}
    for bench, name, fn in [("P1", "p1_open_bind.png", chart_p1), ("P3", "p3_memory.png", chart_p3),
                            ("P4", "p4_cold.png", chart_p4)]:
        if any(r.bench == bench for r in rows) and fn(rows, get, os.path.join(args.out, name)):
            charts[bench] = name
    mach = machine(args)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(markdown(rows, get, gs, info, mach, args, charts))
    print(table_text(rows))
    print()
    for g in gs:
        print(f"{'met   ' if g.met else 'MISSED'} {g.bench}: {g.text}: {g.measured} (target {g.target})")
    print(f"\nreport: {os.path.join(args.out, 'report.md')}")


if __name__ == "__main__":
    main()
