"""P15 (issue 30): tensor-parallel ranks on model (b), the LLaMA-style decoder
of the peers benchmark. W rank processes (started together on a cold page
cache) each build the rank's module on the meta device (heads, KV heads, MLP
width and vocabulary divided by W: the parameter shapes of a Megatron rank),
bind or load its slice of every weight, then read every element of it, as
serving does. Per loader:

- tsar, packed with the plan (samples/tp/llama.plan.json, --tp W): each
  slice is one contiguous run of the file; load_into(rank=, world=).
- tsar, the same model packed without a plan: load_into(rank=, world=) binds
  strided views (the row-parallel ones span every page of their tensor).
- safetensors get_slice (the peer): safe_open, then get_slice(name)[rows]
  or [:, cols] per weight, load_state_dict(assign=True), tie_weights().

Reported per rank: bind (or load) time; Rss of its mappings of the model file
(the pages it maps: goal for tsar with the plan: the replicated bytes plus
1/W of the sharded ones, within 5%); summed Pss of the file mappings over the
W ranks (one copy when they share); and each process's whole Pss above a
process that built the rank's module on meta and loaded nothing (what
copies cost). Then the two-level case: W ranks x 2 workers each on the
planned archive, summed Pss of the file mappings (goal: about one copy).

The worker is ``python -m peers.p15_tp worker LOADER PATH RANK WORLD SIZE``;
it prints ``READY <seconds of the bind> <tsar's path>`` and holds until stdin
closes. LOADER "tsar" runs the path its environment chooses (the accelerator
unless TSAR_PORTABLE is set), "tsar-portable" the portable path
(TSAR_PORTABLE=1 in its environment), "safetensors", or "meta" (loads nothing).
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import time

import torch

from peers.p9_warm import evict
from peers.procs import BENCH, file_pss_kib, pss_kib

PLAN = os.path.join(os.path.dirname(BENCH), "samples", "tp", "llama.plan.json")


def rank_config(config, world: int):
    c = copy.deepcopy(config)
    c.head_dim = config.hidden_size // config.num_attention_heads
    c.num_attention_heads //= world
    c.num_key_value_heads //= world
    c.intermediate_size //= world
    c.vocab_size //= world
    return c


def rank_module(size: str, world: int):
    import transformers

    import tsar
    from peers import models

    # Parameters on meta, buffers (the rotary frequencies) made for real: a
    # bind refuses a module that would keep meta tensors it cannot bind.
    with tsar.empty_parameters():
        m = transformers.LlamaForCausalLM(rank_config(models.llama_config(size), world))
    return m.to(torch.bfloat16).eval()


def _safetensors_slices(module, path: str, rank: int, world: int):
    from safetensors import safe_open

    sd = {}
    with safe_open(path, framework="pt") as f:
        names = set(f.keys())
        aliases = f.metadata() or {}  # save_model keeps one name of a tie: {dropped: kept}
        for name, p in module.state_dict().items():
            key = name if name in names else aliases[name]
            sl = f.get_slice(key)
            full = sl.get_shape()
            want = list(p.shape)
            dims = [d for d in range(len(full)) if full[d] != want[d]]
            if not dims:
                sd[name] = sl[:]
                continue
            d, n = dims[0], want[dims[0]]
            index = [slice(None)] * len(full)
            index[d] = slice(rank * n, (rank + 1) * n)
            sd[name] = sl[tuple(index)]
    module.load_state_dict(sd, assign=True, strict=True)
    module.tie_weights()


def worker(loader: str, path: str, rank: int, world: int, size: str) -> None:
    import tsar
    from tsar import _backend

    from peers.models import _rebuild_rotary_on_cpu

    module = rank_module(size, world)
    path_run = "accelerator" if _backend.accelerator is not None else "portable"
    if loader == "tsar-portable" and path_run != "portable":
        raise RuntimeError(f"tsar-portable runs {tsar.backend()}")
    t0 = time.perf_counter()
    if loader in ("tsar", "tsar-portable"):
        tsar.load_into(module, path, rank=rank, world=world)
    elif loader == "safetensors":
        _safetensors_slices(module, path, rank, world)
    bind = time.perf_counter() - t0
    if loader != "meta":
        _rebuild_rotary_on_cpu(module)
        total = 0.0
        for p in module.parameters():  # every element, as serving reads them
            total += float(p.sum())
    print(f"READY {bind:.6f} {path_run if loader.startswith('tsar') else '-'}", flush=True)
    sys.stdin.read()


def _spawn(loader, path, rank, world, size):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [BENCH] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if loader == "tsar-portable":
        env["TSAR_PORTABLE"] = "1"
    return subprocess.Popen([sys.executable, "-m", "peers.p15_tp", "worker", loader, path, str(rank),
                             str(world), size], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _file_rss_kib(pid: int, path: str) -> int:
    want, total, inside = os.path.realpath(path), 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = len(head) >= 6 and os.path.realpath(head[5]) == want
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


def run_ranks(loader, path, world, size, workers_per_rank=1):
    """Starts every rank (x workers) together on a cold cache; per process
    (rank, bind s, file Rss KiB, file Pss KiB, whole Pss KiB, tsar's path or "-")."""
    evict([path])
    ps = [(r, _spawn(loader, path, r, world, size)) for r in range(world) for _ in range(workers_per_rank)]
    out = []
    try:
        for r, p in ps:
            line = p.stdout.readline()
            if not line.startswith("READY "):
                raise RuntimeError(f"{loader} rank {r}: {line.strip()} {p.stderr.read()[-2000:]}")
            words = line.split()
            out.append([r, float(words[1]), words[2] if len(words) > 2 else "-"])
        for row, (r, p) in zip(out, ps):
            row[2:2] = [_file_rss_kib(p.pid, path), file_pss_kib(p.pid, [path]), pss_kib(p.pid)]
    finally:
        for _, p in ps:
            p.stdin.close()
            p.wait()
    return out


def plan_bytes(path: str, world: int):
    """(replicated bytes, sharded bytes) of a planned archive, from its index."""
    import tsar

    a = tsar.open(path)
    seen, replicated, sharded = set(), 0, 0
    for i in a.infos():
        if i.storage in seen:
            continue
        seen.add(i.storage)
        n = 1
        for s in i.shape:
            n *= s
        n *= torch.empty((), dtype=i.dtype).element_size()
        if i.shard_dim is None:
            replicated += n
        else:
            sharded += n
    return replicated, sharded


def p15(rep, src, workdir, log, world=4):
    import tsar

    from peers import adapters, models

    # The small model has 2 KV heads: 2 ranks there.
    while models.llama_config(src.spec.size).num_key_value_heads % world:
        world //= 2

    rep.text(f"## P15: {world} tensor-parallel ranks, model (b)")
    plan = json.load(open(PLAN))["shard"]
    planned = os.path.join(workdir, f"llama-tp{world}.tsar")
    tsar.save(src.state_dict, planned, tp=world, shard=plan)
    plain = adapters.by_name(["tsar"])[0].prepare(src)
    st = src.file("safetensors")
    replicated, sharded = plan_bytes(planned, world)
    goal = replicated + sharded / world
    size = src.spec.size
    base = run_ranks("meta", plain, world, size)
    floor_kib = sum(r[4] for r in base) / len(base)
    rows = []
    for name, loader, path in (("tsar, packed for the ranks", "tsar", planned),
                               ("tsar, packed without a plan", "tsar", plain),
                               ("safetensors get_slice", "safetensors", st)):
        log(f"# P15 {name}")
        res = run_ranks(loader, path, world, size)
        rss = [r[2] * 1024 for r in res]
        pss = sum(r[3] for r in res) * 1024
        above = [(r[4] - floor_kib) * 1024 for r in res]
        bind = [r[1] for r in res]
        for r in res:
            rep.row("P15", "b", name, f"rank {r[0]} bind", f"{r[1]:.6f}", "s")
            rep.row("P15", "b", name, f"rank {r[0]} file Rss", f"{r[2] * 1024}", "B")
        rep.row("P15", "b", name, f"summed file Pss of {world} ranks", f"{pss}", "B")
        rows.append([name, f"{1e3 * min(bind):.1f}-{1e3 * max(bind):.1f}",
                     f"{max(rss) / 2**20:.0f} ({max(rss) / goal:.3f}x)", f"{pss / 2**20:.0f}",
                     f"{sum(above) / 2**20:.0f}"])
    two = run_ranks("tsar", planned, world, size, workers_per_rank=2)
    two_pss = sum(r[3] for r in two) * 1024
    rep.row("P15", "b", "tsar, packed for the ranks", f"summed file Pss of {world} ranks x 2 workers",
            f"{two_pss}", "B")
    one = replicated + sharded  # one copy of the model's bytes (the file adds zero padding)
    rep.text(f"{world} rank processes started together on a cold cache (file evicted), each building its "
             "rank's module on meta, binding (or loading) its slices, then reading every element. The "
             f"planned archive holds {replicated / 2**20:.0f} MiB stored whole and {sharded / 2**20:.0f} "
             f"MiB of sharded weights: a rank needs {goal / 2**20:.0f} MiB (goal for tsar with the plan: "
             "its file Rss within 5% of that). Summed file Pss: the ranks' mappings of the model file "
             "together (one copy when they share pages). Pss above the floor: each process's whole Pss "
             f"minus that of a rank that built its module on meta and loaded nothing "
             f"({floor_kib / 1024:.0f} MiB): copies show here.")
    rep.text()
    rep.table(["loader", "bind ms (ranks)", "largest rank's file Rss MiB (x need)",
               f"summed file Pss of {world} MiB", f"summed Pss above the floor MiB"], rows)
    rep.text()
    rep.text(f"Two-level: {world} ranks x 2 workers each on the planned archive: summed file Pss "
             f"{two_pss / 2**20:.0f} MiB for {one / 2**20:.0f} MiB of tensors ({two_pss / one:.3f}x one "
             f"copy; the file is {os.path.getsize(planned) / 2**20:.0f} MiB with the zero padding that "
             "aligns each slice to 2 MiB, which no process reads).")
    rep.text()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    for a in ("loader", "path"):
        w.add_argument(a)
    w.add_argument("rank", type=int)
    w.add_argument("world", type=int)
    w.add_argument("size")
    args = ap.parse_args()
    worker(args.loader, args.path, args.rank, args.world, args.size)


if __name__ == "__main__":
    main()
