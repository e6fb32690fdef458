#!/usr/bin/python3
"""quantized.py [--size tiny|small|bench] [--quant int8,int4] [--rounds N]
[--repeat N] [--workdir DIR] [--out FILE] [--csv FILE]: P18, warm open + bind
of a quantized LLaMA (issue 58).

Model (b) of peers/models.py (the LLaMA-style decoder with tied embeddings,
bf16) at --size, quantized by transformers with torchao:
``from_pretrained(bf16 dir, quantization_config=TorchAoConfig(CONFIG))``, which
quantizes every nn.Linear but lm_head (tied to the input embedding, kept bf16
as transformers does), with CONFIG
  int8  Int8WeightOnlyConfig()                                  -> Int8Tensor
  int4  IntxWeightOnlyConfig(weight_dtype=torch.int4,
                             granularity=PerGroup(32))          -> IntxUnpackedToInt8Tensor
That one quantized model is written three ways into --workdir:
  tsar                 tsar.save(model.state_dict(), "q.tsar")
  torch.load(mmap)     torch.save(model.state_dict(), "q.pt")
  from_pretrained      model.save_pretrained("hf/") (safetensors; the torchao
                       tensors flattened by torchao.prototype.safetensors, the
                       TorchAoConfig in config.json)
and loaded back, each loader in a fresh process of its own:
  tsar                 build: ``with tsar.empty_parameters():`` the
                       architecture (plain bf16 parameters on meta);
                       bind: ``tsar.load_into(model, "q.tsar")`` (open + bind)
  torch.load(mmap)     build: the architecture on meta (rotary buffers on the
                       CPU, as P9); bind: ``sd = torch.load(p, mmap=True,
                       weights_only=True)`` + ``load_state_dict(sd,
                       assign=True)`` + re-tie (P9's assign_state_dict).
                       weights_only=True works for these two classes: torchao
                       registers its tensor classes, dataclasses and enums as
                       safe globals at import. It fails for checkpoints whose
                       tensors hold an enum (Int8DynamicActivationInt8WeightConfig's
                       MappingType, Float8WeightOnlyConfig's KernelPreference):
                       Python 3.11 pickles an enum member as
                       ``getattr(EnumClass, "NAME")``, and the weights-only
                       unpickler refuses the ``getattr`` global
  torch.load(mmap, weights_only=False)   the same with the full unpickler
  from_pretrained      load: ``LlamaForCausalLM.from_pretrained("hf/",
                       dtype="auto")`` (builds its own architecture on meta:
                       its figure is build + open + bind in one call)
Every process imports torch, transformers and torchao, runs one untimed load
(imports, first-use costs), then --repeat timed loads, the garbage collector
off while a step is timed (p9_warm._timed). --rounds rounds of one process per
loader, the order rotating between rounds; every file is evicted and read once
(p9_warm.warm_page_cache) right before each process. Medians over all runs.

Checks, in the same processes: after its last load each process runs the
forward on one input (models.ModelSpec.example_input) and saves the logits;
the parent compares each loader's with the in-memory quantized model's and
with torch.load's, bit for bit, and counts the torchao tensors each loaded
module holds (a loader that dequantized would have none).

tsar's row: if ``tsar.save`` raises on the quantized state_dict (tsar before
issue 58), or the tsar package is not importable, the row says so and the
peers are measured alone. Needs the tsar package on sys.path for its row
(PYTHONPATH=build/python), transformers and torchao in the venv.
"""
import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Dict

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)

import torch  # noqa: E402

from peers import adapters, models  # noqa: E402
from peers.p9_warm import _timed, warm_page_cache  # noqa: E402

QUANTS = ("int8", "int4")
LOADERS = ("tsar", "torch.load(mmap)", "torch.load(mmap, weights_only=False)", "from_pretrained")
FILES = {"tsar": "q.tsar", "torch.load(mmap)": "q.pt", "torch.load(mmap, weights_only=False)": "q.pt",
         "from_pretrained": "hf"}
CALLS = {
    "tsar": "with tsar.empty_parameters(): model = LlamaForCausalLM(config)  |  "
            "tsar.load_into(model, 'q.tsar')",
    "torch.load(mmap)": "with torch.device('meta'): model = ...  |  sd = torch.load(p, mmap=True, "
                        "weights_only=True); model.load_state_dict(sd, assign=True); re-tie",
    "torch.load(mmap, weights_only=False)": "the same, weights_only=False",
    "from_pretrained": "LlamaForCausalLM.from_pretrained('hf/', dtype='auto').eval()  (builds on meta itself)",
}


def quant_config(name: str):
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    if name == "int8":
        return Int8WeightOnlyConfig()
    if name == "int4":
        return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
    raise ValueError(f"--quant: expected one of {', '.join(QUANTS)}, found {name!r}")


def _quiet():
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)  # torchao's register_constant deprecation, per enum
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def torchao_tensors(module: torch.nn.Module) -> int:
    """How many of the module's parameters are torchao tensor subclasses."""
    return sum(1 for _, p in module.named_parameters(remove_duplicate=False)
               if type(p).__module__.startswith("torchao"))


# --- the files ---------------------------------------------------------------------
def prepare(size: str, quant: str, workdir: str, log=print) -> Dict[str, object]:
    """Writes the three files of the quantized model (b) at ``size`` into
    ``workdir``, the reference logits (ref.pt) and prep.json; returns what
    prep.json holds: the tsar row's skip reason (None if tsar.save worked),
    file sizes, tensor counts."""
    from transformers import LlamaForCausalLM, TorchAoConfig

    _quiet()
    spec = models.spec("b", size)
    os.makedirs(workdir, exist_ok=True)
    base = os.path.join(workdir, "base")
    log(f"# {spec.title}: reference weights, bf16 save_pretrained")
    ref = spec.reference()
    ref.save_pretrained(base)
    del ref
    gc.collect()
    log(f"# quantizing ({quant}) through from_pretrained(quantization_config=TorchAoConfig(...))")
    t0 = time.perf_counter()
    q = LlamaForCausalLM.from_pretrained(base, quantization_config=TorchAoConfig(quant_config(quant)),
                                         dtype=torch.bfloat16).eval()
    quantize_s = time.perf_counter() - t0
    shutil.rmtree(base)
    info: Dict[str, object] = {"size": size, "quant": quant, "title": spec.title,
                               "quantize_s": quantize_s, "torchao_tensors": torchao_tensors(q)}
    sd = q.state_dict()
    w = q.model.layers[0].self_attn.q_proj.weight
    info["class"] = type(w).__name__
    info["state_dict"] = len(sd)
    torch.save(spec.forward(q, spec.example_input()), os.path.join(workdir, "ref.pt"))
    log("# writing q.pt (torch.save), hf/ (save_pretrained), q.tsar (tsar.save)")
    torch.save(sd, os.path.join(workdir, "q.pt"))
    q.save_pretrained(os.path.join(workdir, "hf"))
    info["tsar_skip"] = None
    try:
        import tsar

        tsar.save(sd, os.path.join(workdir, "q.tsar"))
    except ImportError as e:
        info["tsar_skip"] = f"the tsar package is not importable ({e}; PYTHONPATH=build/python)"
    except Exception as e:  # tsar before issue 58 refuses torchao tensors
        msg = " ".join(str(e).split())
        info["tsar_skip"] = f"tsar.save raised {type(e).__name__}: {msg[:300]}"
    if info["tsar_skip"] and os.path.exists(os.path.join(workdir, "q.tsar")):
        os.remove(os.path.join(workdir, "q.tsar"))
    info["bytes"] = {name: sum(os.path.getsize(f) for f in adapters.files_of(os.path.join(workdir, fn)))
                     for name, fn in FILES.items() if os.path.exists(os.path.join(workdir, fn))}
    with open(os.path.join(workdir, "prep.json"), "w") as f:
        json.dump(info, f)
    return info


# --- one loader, in its own process --------------------------------------------------
def _load_once(loader: str, spec, path: str):
    """(build seconds or None, bind-or-load seconds, module)."""
    if loader == "from_pretrained":
        from transformers import LlamaForCausalLM

        dt, module = _timed(lambda: LlamaForCausalLM.from_pretrained(path, dtype="auto").eval())
        return None, dt, module
    gc.collect()
    gc.disable()  # build, then bind straight after, as a server does (p9_warm.measure)
    try:
        if loader == "tsar":
            import tsar

            def build():
                with tsar.empty_parameters():
                    return spec.make(meta=False)

            def bind(module):
                tsar.load_into(module, path)
                return module
        else:
            weights_only = loader == "torch.load(mmap)"

            def build():
                return spec.make(meta=True)

            def bind(module):
                sd = torch.load(path, mmap=True, weights_only=weights_only)
                return adapters.assign_state_dict(module, sd)
        build_s, fresh = _timed(build, collect=False)
        bind_s, module = _timed(lambda: bind(fresh), collect=False)
    finally:
        gc.enable()
    return build_s, bind_s, module


def measure_one(loader: str, size: str, path: str, repeat: int, logits_out: str) -> Dict[str, object]:
    import torchao  # noqa: F401  (every process imports it: the classes, and torch.load's safe globals)
    import transformers  # noqa: F401

    _quiet()
    spec = models.spec("b", size)
    runs = {"build": [], "bind": []}
    first = _load_once(loader, spec, path)[2]  # untimed: imports, first-use costs
    del first
    module = None
    for _ in range(repeat):
        module = None
        build_s, bind_s, module = _load_once(loader, spec, path)
        if build_s is not None:
            runs["build"].append(build_s)
        runs["bind"].append(bind_s)
    torch.save(spec.forward(module, spec.example_input()), logits_out)
    out = {"runs": runs, "torchao_tensors": torchao_tensors(module),
           "class": type(module.model.layers[0].self_attn.q_proj.weight).__name__}
    if "tsar" in sys.modules:
        out["backend"] = sys.modules["tsar"].backend()
    return out


def measure_apart(loader: str, size: str, path: str, repeat: int, logits_out: str) -> Dict[str, object]:
    """measure_one in a fresh process; {"error": text} if it failed."""
    path_list = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BENCH] + path_list))
    cmd = [sys.executable, "-m", "peers.quantized", "--one", loader, "--size", size, "--path", path,
           "--repeat", str(repeat), "--logits", logits_out]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr.strip() or done.stdout.strip())[-1500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the run -----------------------------------------------------------------------
def run(size: str, quant: str, rounds: int, repeat: int, workdir: str, log=print) -> Dict[str, object]:
    info = prepare(size, quant, workdir, log)
    loaders = [x for x in LOADERS if not (x == "tsar" and info["tsar_skip"])]
    res: Dict[str, Dict[str, object]] = {x: {"build": [], "bind": [], "errors": []} for x in loaders}
    files = {x: adapters.files_of(os.path.join(workdir, FILES[x])) for x in loaders}
    for r in range(rounds):
        k = r % len(loaders)
        for loader in loaders[k:] + loaders[:k]:
            log(f"# P18 {size} {quant}, round {r + 1} of {rounds}: {loader}, {repeat} runs")
            warm_page_cache(files[loader])
            logits = os.path.join(workdir, f"logits-{LOADERS.index(loader)}.pt")
            m = measure_apart(loader, size, os.path.join(workdir, FILES[loader]), repeat, logits)
            o = res[loader]
            if "error" in m:
                o["errors"].append(m["error"])
                log(f"# {loader} failed: {m['error'][-400:]}")
                continue
            o["build"] += m["runs"]["build"]
            o["bind"] += m["runs"]["bind"]
            o["torchao_tensors"], o["class"] = m["torchao_tensors"], m["class"]
            o["backend"] = m.get("backend")
            o["logits"] = logits
    ref = torch.load(os.path.join(workdir, "ref.pt"))
    base = res.get("torch.load(mmap)", {}).get("logits")
    base = torch.load(base) if base else None
    for loader, o in res.items():
        if o.get("logits"):
            y = torch.load(o["logits"])
            o["equal_ref"] = torch.equal(y, ref)
            o["equal_torch_load"] = torch.equal(y, base) if base is not None else None
    return {"info": info, "results": res, "loaders": loaders}


def _ms(x):
    return "-" if x is None else f"{x * 1e3:.2f}"


def _med(xs):
    return statistics.median(xs) if xs else None


def table(out: Dict[str, object]) -> str:
    info, res = out["info"], out["results"]
    lines = [f"P18 open + bind of a quantized LLaMA: {info['title']}, {info['quant']} "
             f"({info['class']}, {info['torchao_tensors']} torchao tensors of {info['state_dict']} "
             f"in the state_dict); median of all runs"]
    figure = {x: _med(o["bind"]) for x, o in res.items()}
    tsar = figure.get("tsar")
    peers = [v for x, v in figure.items() if x != "tsar" and v]
    fastest = min(peers) if peers else None
    head = ["loader", "build ms", "open+bind ms (min-max)", "runs", "/ tsar", "/ fastest peer",
            "file MiB", "torchao tensors", "logits == in-memory", "logits == torch.load"]
    rows = []
    for x in out["loaders"]:
        o = res[x]
        b = figure[x]
        if b is None:
            rows.append([x, "-", "failed: " + (o["errors"][-1].splitlines()[-1][:80] if o["errors"] else "?")]
                        + ["-"] * (len(head) - 3))
            continue
        span = f"{_ms(b)} ({_ms(min(o['bind']))}-{_ms(max(o['bind']))})"
        if x == "from_pretrained":
            span += " [whole load]"
        rows.append([x, _ms(_med(o["build"])), span, str(len(o["bind"])),
                     f"{b / tsar:.1f}x" if tsar else "-", f"{b / fastest:.2f}x" if fastest else "-",
                     f"{info['bytes'].get(x, 0) / 2**20:.1f}", str(o.get("torchao_tensors", "-")),
                     str(o.get("equal_ref", "-")), str(o.get("equal_torch_load", "-"))])
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    lines.append(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    if info["tsar_skip"]:
        lines.append(f"tsar: not measured: {info['tsar_skip']}")
    elif res.get("tsar", {}).get("backend"):
        lines.append(f"tsar: {res['tsar']['backend']}")
    lines.append("calls: " + "; ".join(f"[{x}] {CALLS[x]}" for x in out["loaders"]))
    return "\n".join(lines)


def write_csv(out: Dict[str, object], path: str) -> None:
    """Appends one row per loader, figure and run (bench,case,variant,unit,run,value)."""
    import csv

    info = out["info"]
    case = f"b {info['size']} {info['quant']}"
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if info["tsar_skip"]:
            w.writerow(["P18 quantized", case, "tsar", info["tsar_skip"], 0, ""])
        for x, o in out["results"].items():
            for figure in ("build", "bind"):
                for i, v in enumerate(o[figure]):
                    w.writerow([f"P18 quantized {figure}", case, x, "s", i, f"{v:.9f}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=models.SIZES, default="small",
                    help="model (b)'s size in peers/models.py (default small, 27 M parameters: "
                         "about 80 s a configuration on 2 cores; bench is P9's 1.1 G parameters)")
    ap.add_argument("--quant", default=",".join(QUANTS), help="comma-separated: int8, int4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="timed loads per process")
    ap.add_argument("--workdir", help="where the files are written (default: a temporary directory)")
    ap.add_argument("--out", help="also write the tables to this file")
    ap.add_argument("--csv", help="append the runs to this samples file")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child: this loader on --path
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--logits", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.size, args.path, args.repeat, args.logits)))
        return
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    owned = None if args.workdir else tempfile.TemporaryDirectory(prefix="p18_")
    root = args.workdir or owned.name
    head = (f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.2f} at start; --size {args.size}, --rounds "
            f"{args.rounds}, --repeat {args.repeat}")
    import torchao
    import transformers

    head += (f"; torch {torch.__version__}, transformers {transformers.__version__}, "
             f"torchao {torchao.__version__}")
    try:
        import tsar

        head += f", tsar {tsar.__version__} ({tsar.backend()})"
    except ImportError:
        pass
    print(head + "\n", flush=True)
    texts = [head]
    try:
        for quant in [q.strip() for q in args.quant.split(",") if q.strip()]:
            quant_config(quant)  # fails early on a bad name
            out = run(args.size, quant, args.rounds, args.repeat, os.path.join(root, quant), log)
            texts.append(table(out))
            print(texts[-1] + "\n", flush=True)
            if args.csv:
                write_csv(out, args.csv)
        if args.out:
            with open(args.out, "w") as f:
                f.write("```\n" + "\n\n".join(texts) + "\n```\n")
    finally:
        if owned:
            owned.cleanup()


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
