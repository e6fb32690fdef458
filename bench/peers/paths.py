"""paths.py [--workdir DIR] [--out DIR] [--size bench] [--p15-sizes bench,tp-small]
[--rounds N] [--repeat N] [--repeat-c N] [--p15-rounds N] [--quiet-load X]

Issue 57, item 3: tsar's two paths side by side, in one run. The accelerator
(tsar._tsar, LibTorch-linked) and the portable path (tsar._tsar_portable, any
torch; chosen with TSAR_PORTABLE=1 in the process's environment), on the same
files:

  P9 (b)  warm open + bind of model (b), the LLaMA-style decoder (291 tensors
          at --size bench), into a module built on meta (p9_warm.py);
  P9 (c)  the same for model (c), 100,000 tensors at --size bench;
  P15     4 tensor-parallel rank processes started together on a cold cache,
          each binding its slices of the archive packed with the plan
          (samples/tp/llama.plan.json), at each of --p15-sizes (p15_tp.py):
          bind time per rank, each rank's file Rss against what it needs,
          summed file Pss, summed Pss above ranks that loaded nothing.

Every P9 measure runs in a fresh process of its own, as p9_warm does: --rounds
rounds, each one process per path (the order alternating between rounds) of
--repeat runs (--repeat-c for (c)). The process's own tsar.backend() is checked
against the path it was meant to run. P15 runs --p15-rounds rounds per path,
alternating too. If the load average at the start of the P9 part is above
--quiet-load, the P9 part runs once more after P15 and the pass that ran with
the lower load average (the mean of its start and end) is kept; both are in the
csv.

Writes OUT/paths.md (the table: median, min, max and runs per path, and the
ratio portable / accelerator) and OUT/paths.csv (every run), with the date, the
commit, the kernel, the workdir's filesystem and the load average at start.
Needs the tsar package on sys.path (PYTHONPATH=build/python).
"""
import argparse
import csv
import gc
import json
import os
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)
# The accelerator's rows run in the environment this process passes on:
# TSAR_PORTABLE unset there, whatever the caller's.
os.environ.pop("TSAR_PORTABLE", None)

import torch  # noqa: E402

from peers import adapters, models, p9_warm  # noqa: E402

# (path, P9 adapter, P9 child's environment, P15 worker's loader)
PATHS = (("accelerator", "tsar", {"TSAR_PORTABLE": "0"}, "tsar"),
         ("portable", "tsar (portable)", {"TSAR_PORTABLE": "1"}, "tsar-portable"))


def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


def git(*args):
    try:
        return subprocess.run(["git", "-C", BENCH, *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def commit():
    """The commit, and the tracked files that differ from it, if any."""
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return head + (f" (+ {len(changed)} tracked files changed in the work tree)" if changed else "")


def filesystem(path):
    """Type, device and mount point of the filesystem holding ``path``."""
    path = os.path.realpath(path)
    best = None
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and (
                    best is None or len(mnt) >= len(best[1])):
                best = (dev, mnt, fstype)
    return f"{best[2]} ({best[0]} on {best[1]})" if best else "unknown"


def fmt(x, digits):
    return "-" if x is None else f"{x:,.{digits}f}"


def stats(xs):
    return (statistics.median(xs), min(xs), max(xs), len(xs)) if xs else (None, None, None, 0)


# --- P9 ----------------------------------------------------------------------------
def prepare_p9(size, workdir, log):
    """Writes model (b)'s and (c)'s archives; returns {kind: (spec, path)},
    and (b)'s Source for P15 at the same size (the caller releases it)."""
    out, keep = {}, None
    for kind in ("b", "c"):
        spec = models.spec(kind, size)
        log(f"# {spec.title}: building the reference weights")
        os.makedirs(os.path.join(workdir, kind), exist_ok=True)
        src = adapters.Source(spec, spec.reference(), os.path.join(workdir, kind))
        out[kind] = (spec, adapters.by_name(["tsar"])[0].prepare(src))
        if kind == "b":
            keep = src
        else:
            src.release()
        gc.collect()
    return out, keep


def p9_pass(files, rounds, repeat, repeat_c, log):
    """{kind: {path: Measurement runs pooled}}, with the load average at the
    start and end of the pass."""
    start = loadavg()
    runs = {kind: {p[0]: {"bind": [], "build": []} for p in PATHS} for kind in files}
    backends = {}
    for kind, (spec, path) in files.items():
        n = repeat_c if kind == "c" else repeat
        for r in range(rounds):
            for name, adapter, env, _ in (PATHS if r % 2 == 0 else PATHS[::-1]):
                log(f"# P9 ({kind}) {spec.size}, round {r + 1} of {rounds}: {name}, {n} runs")
                a = adapters.by_name([adapter])[0]
                m = p9_warm.measure_apart(a, spec, path, n, env=env)
                if not (m.backend or "").startswith(name):
                    raise RuntimeError(f"P9 {name}: the measuring process ran {m.backend}")
                backends[name] = m.backend
                runs[kind][name]["bind"] += m.runs["bind"]
                runs[kind][name]["build"] += m.runs["build"]
    return {"start": start, "end": loadavg(), "runs": runs, "backends": backends}


def tensor_counts(spec, path):
    """(names a module binds, tensors the archive stores)."""
    import tsar

    names = len(spec.make(True).state_dict())
    with tsar.open(path) as a:
        stored = len(a.infos())
    return names, stored


# --- P15 ---------------------------------------------------------------------------
def llama_spec(size):
    # tp-small is P15's own size: not one of models.SIZES, which every measure offers.
    return models.spec("b", size) if size in models.SIZES else models._llama(size)


def prepare_p15(size, workdir, src, log):
    """The planned archive of model (b) at ``size``; (path, world, need bytes,
    replicated, sharded)."""
    import tsar

    from peers import p15_tp

    world = 4
    while models.llama_config(size).num_key_value_heads % world:
        world //= 2
    own = src is None
    if own:
        spec = llama_spec(size)
        log(f"# {spec.title} ({size}): building the reference weights")
        os.makedirs(os.path.join(workdir, f"b-{size}"), exist_ok=True)
        src = adapters.Source(spec, spec.reference(), os.path.join(workdir, f"b-{size}"))
    plan = json.load(open(p15_tp.PLAN))["shard"]
    path = os.path.join(src.workdir, f"llama-{size}-tp{world}.tsar")
    tsar.save(src.state_dict, path, tp=world, shard=plan)
    if own:
        src.release()
        gc.collect()
    replicated, sharded = p15_tp.plan_bytes(path, world)
    return path, world, replicated + sharded / world, replicated, sharded


def p15_size(size, prepared, rounds, log):
    from peers import p15_tp

    path, world, need, replicated, sharded = prepared
    log(f"# P15 {size}: {world} ranks that load nothing (the floor)")
    floor = p15_tp.run_ranks("meta", path, world, size)
    floor_kib = sum(r[4] for r in floor) / len(floor)
    out = {name: {"bind": [], "rss": [], "pss": [], "above": [], "rank_rows": []}
           for name, *_ in PATHS}
    for r in range(rounds):
        for name, _, _, loader in (PATHS if r % 2 == 0 else PATHS[::-1]):
            log(f"# P15 {size}, round {r + 1} of {rounds}: {name}")
            res = p15_tp.run_ranks(loader, path, world, size)
            for row in res:
                if row[5] != name:
                    raise RuntimeError(f"P15 {name}: rank {row[0]} ran the {row[5]} path")
            o = out[name]
            o["bind"] += [row[1] for row in res]
            o["rss"] += [row[2] * 1024 for row in res]
            o["pss"].append(sum(row[3] for row in res) * 1024)
            o["above"].append(sum(row[4] - floor_kib for row in res) * 1024)
            o["rank_rows"].append(res)
    return {"world": world, "need": need, "replicated": replicated, "sharded": sharded,
            "floor": floor_kib * 1024, "file": os.path.getsize(path), "runs": out}


# --- the report --------------------------------------------------------------------
HEAD = ["date", "commit", "kernel", "filesystem", "load at start"]


def csv_rows(meta, p9, p9_passes, kept, p15):
    """Every run: P9's per pass (kept or not), P15's per rank."""
    common = [meta[k] for k in HEAD]
    rows = []
    for i, ps in enumerate(p9_passes):
        for kind, per in ps["runs"].items():
            for name, figs in per.items():
                for fig, xs in figs.items():
                    figure = "open + bind" if fig == "bind" else "build on meta"
                    rows += [common + [i + 1, "yes" if i == kept else "no", "P9", kind,
                                       p9[kind][0].size, name, figure, j, f"{x:.9f}", "s"]
                             for j, x in enumerate(xs)]
    for size, res in p15.items():
        for name, o in res["runs"].items():
            for rnd, ranks in enumerate(o["rank_rows"]):
                for r in ranks:
                    for fig, val, unit in (("bind", f"{r[1]:.6f}", "s"),
                                           ("file Rss", r[2] * 1024, "B"),
                                           ("file Pss", r[3] * 1024, "B"),
                                           ("whole Pss", r[4] * 1024, "B")):
                        rows.append(common + ["", "", "P15", "b", size, name,
                                              f"rank {r[0]} {fig}", rnd, val, unit])
    return rows


def write(out_dir, meta, p9, p9_passes, kept, p15, counts):
    os.makedirs(out_dir, exist_ok=True)
    table = []

    def line(figure, per_path, digits):
        cells, med = [figure], {}
        for name, *_ in PATHS:
            m, lo, hi, n = stats(per_path.get(name, []))
            med[name] = m
            cells += [fmt(m, digits), fmt(lo, digits), fmt(hi, digits), str(n)]
        a, p = med["accelerator"], med["portable"]
        cells.append(f"{p / a:.2f}x" if a and p is not None else "-")
        table.append(cells)
        return med

    p9_medians = {}
    if p9_passes:
        runs = p9_passes[kept]["runs"]
        for kind in runs:
            names, stored = counts[kind]
            per = {n: [x * 1e3 for x in v["bind"]] for n, v in runs[kind].items()}
            p9_medians[kind] = line(f"P9 ({kind}) {p9[kind][0].size}: warm open + bind, "
                                    f"{names:,} tensors ({stored:,} stored), ms",
                                    per, 2 if kind == "b" else 1)
    for size, res in p15.items():
        world, need, runs = res["world"], res["need"], res["runs"]

        def per(key, f):
            return {n: [f(x) for x in o[key]] for n, o in runs.items()}

        line(f"P15 {size}: bind of a rank's slices, {world} ranks together, ms",
             per("bind", lambda x: x * 1e3), 2)
        line(f"P15 {size}: a rank's file Rss, MiB (it needs {need / 2**20:,.1f})",
             per("rss", lambda x: x / 2**20), 1)
        line(f"P15 {size}: a rank's file Rss, x need", per("rss", lambda x: x / need), 3)
        line(f"P15 {size}: summed file Pss of {world} ranks, MiB",
             per("pss", lambda x: x / 2**20), 0)
        line(f"P15 {size}: summed Pss above {world} ranks that load nothing, MiB",
             per("above", lambda x: x / 2**20), 0)

    with open(os.path.join(out_dir, "paths.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEAD + ["pass", "kept", "measure", "model", "size", "path", "figure", "run",
                           "value", "unit"])
        w.writerows(csv_rows(meta, p9, p9_passes, kept, p15))

    md = [f"# tsar's two paths, one run ({meta['date']})", ""]
    md.append(f"Commit {meta['commit']}; kernel {meta['kernel']}; {os.cpu_count()} cores; "
              f"workdir on {meta['filesystem']}; torch {torch.__version__}; tsar from "
              f"`{meta['package']}`; load average {meta['load at start']} at start, "
              f"{meta['load at end']} at the end.")
    md.append("")
    for name, *_ in PATHS:
        md.append(f"- **{name}**: `{meta['backends'].get(name, '?')}`")
    md.append("")
    hdr = ["figure"]
    for name, *_ in PATHS:
        hdr += [f"{name} median", "min", "max", "runs"]
    hdr.append("portable / accelerator (medians)")
    md.append("| " + " | ".join(hdr) + " |")
    md.append("|" + "---|" * len(hdr))
    md += ["| " + " | ".join(r) + " |" for r in table]
    md.append("")
    if p9_passes:
        ps = p9_passes[kept]
        md.append(f"P9: each path in a fresh process per round ({meta['rounds']} rounds, the "
                  f"order alternating; {meta['repeat']} runs a process for (b), "
                  f"{meta['repeat_c']} for (c)), warm cache (the archive evicted and read once "
                  "before each process's runs), one untimed load first, the garbage collector off "
                  "while timing: `tsar.load_into(module, path)` into the module built on meta "
                  "just before. Load average over the kept P9 pass: "
                  f"{ps['start']:.2f} at its start, {ps['end']:.2f} at its end.")
        if len(p9_passes) > 1:
            md.append("")
            said = "; ".join(f"pass {i + 1} {p['start']:.2f} -> {p['end']:.2f}"
                             + (" (kept: the quieter)" if i == kept else "")
                             for i, p in enumerate(p9_passes))
            md.append(f"The load average was above {meta['quiet_load']:.1f} at the start of "
                      f"the first P9 pass, so P9 ran twice: {said}. Both passes' runs are in "
                      "the csv.")
        md.append("")
        verdicts = []
        for kind, med in p9_medians.items():
            r = med["portable"] / med["accelerator"]
            v = f"P9 ({kind}) portable / accelerator {r:.2f}x (within 2x: " \
                f"{'yes' if r <= 2 else 'no'})"
            if kind == "b":
                v += f"; the portable bind {med['portable']:.2f} ms (<= 1 ms: " \
                     f"{'met' if med['portable'] <= 1 else 'missed'})"
            verdicts.append(v)
        md.append("- " + "; ".join(verdicts) + ".")
        md.append("")
    for size, res in p15.items():
        md.append(f"P15 {size}: {res['world']} rank processes started together on a cold cache "
                  "(the archive evicted), each building its rank's module on meta, binding its "
                  "slices (`tsar.load_into(module, path, rank=, world=)`), then reading every "
                  f"element; {meta['p15_rounds']} rounds per path, the order alternating. The "
                  f"planned archive ({res['file'] / 2**20:,.0f} MiB with the padding that aligns "
                  f"each slice to 2 MiB) holds {res['replicated'] / 2**20:,.1f} MiB stored whole "
                  f"and {res['sharded'] / 2**20:,.1f} MiB sharded: a rank needs "
                  f"{res['need'] / 2**20:,.1f} MiB. The floor: a rank that built its module and "
                  f"loaded nothing, {res['floor'] / 2**20:,.0f} MiB of Pss. A rank binds once, "
                  "so its bind is the process's first: on the portable path that includes "
                  "importing the portable modules and extension (tsar imports them at the first "
                  "open), which the accelerator's processes import with `import tsar`.")
        md.append("")
    md.append(f"Made by `{meta['command']}`.")
    text = wrap("\n".join(md))
    with open(os.path.join(out_dir, "paths.md"), "w") as f:
        f.write(text + "\n")
    return text


def wrap(md, width=100):
    """Text lines of ``md`` filled to ``width`` columns; table rows as they are."""
    import textwrap

    return "\n".join(line if line.startswith("|") or len(line) <= width else
                     textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False,
                                   subsequent_indent="  " if line.startswith("- ") else "")
                     for line in md.split("\n"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True,
                    help="where the models are written (several GiB at bench)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "peers"))
    ap.add_argument("--size", choices=models.SIZES, default="bench",
                    help="P9's models (b) and (c)")
    ap.add_argument("--p15-sizes", default="bench,tp-small",
                    help="model (b)'s sizes for P15, comma-separated ('' for none)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="P9: fresh processes per path and model")
    ap.add_argument("--repeat", type=int, default=9, help="P9 (b): runs in each process")
    ap.add_argument("--repeat-c", type=int, default=5, help="P9 (c): runs in each process")
    ap.add_argument("--p15-rounds", type=int, default=3)
    ap.add_argument("--commit", help="the commit the tsar package on PYTHONPATH was built from, "
                                     "where it is not this checkout's (default: this checkout's)")
    ap.add_argument("--quiet-load", type=float, default=1.5,
                    help="above this load average at P9's start, P9 runs twice and the "
                         "quieter pass is kept")
    args = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    import tsar

    start = loadavg()
    log(f"# load average at start: {open('/proc/loadavg').read().strip()}")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": args.commit or commit(),
            "kernel": os.uname().release, "filesystem": filesystem(args.workdir),
            "load at start": f"{start:.2f}", "package": os.path.dirname(tsar.__file__),
            "rounds": args.rounds, "repeat": args.repeat, "repeat_c": args.repeat_c,
            "p15_rounds": args.p15_rounds, "quiet_load": args.quiet_load,
            "command": "python bench/peers/paths.py " + " ".join(sys.argv[1:])}
    os.makedirs(args.workdir, exist_ok=True)
    p15_sizes = [s for s in args.p15_sizes.split(",") if s]
    p9_files, b_src = prepare_p9(args.size, args.workdir, log)
    counts = {kind: tensor_counts(spec, path) for kind, (spec, path) in p9_files.items()}
    prepared = {}
    for size in p15_sizes:
        prepared[size] = prepare_p15(size, args.workdir, b_src if size == args.size else None, log)
    b_src.release()
    del b_src
    gc.collect()

    passes = [p9_pass(p9_files, args.rounds, args.repeat, args.repeat_c, log)]
    log(f"# P9 pass 1: load {passes[0]['start']:.2f} -> {passes[0]['end']:.2f}")
    p15 = {size: p15_size(size, prepared[size], args.p15_rounds, log) for size in p15_sizes}
    if passes[0]["start"] > args.quiet_load:
        log(f"# the load was {passes[0]['start']:.2f} at P9's start: P9 once more")
        passes.append(p9_pass(p9_files, args.rounds, args.repeat, args.repeat_c, log))
        log(f"# P9 pass 2: load {passes[1]['start']:.2f} -> {passes[1]['end']:.2f}")
    kept = min(range(len(passes)), key=lambda i: passes[i]["start"] + passes[i]["end"])
    meta["backends"] = passes[0]["backends"]
    meta["load at end"] = f"{loadavg():.2f}"
    log(f"# load average at the end: {open('/proc/loadavg').read().strip()}")
    print(write(args.out, meta, p9_files, passes, kept, p15, counts))


if __name__ == "__main__":
    main()
