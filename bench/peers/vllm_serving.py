#!/usr/bin/env python3
"""vllm_serving.py [--workdir DIR] [--runs N] [--replicas 2,4] [--loaders A,B]
[--pss-loaders A,B] [--out FILE]: P20, tsar as a vLLM load format against the
loaders vLLM users pick (issue 59, item 4).

Runs in a vLLM environment with tsar installed (scripts/requirements-vllm.txt;
the peers: ``pip install fastsafetensors==0.5.0 runai-model-streamer==0.17.1
tensorizer==2.12.1``; a peer that is missing or fails is a row saying why).

Model: a LLaMA of 1.04 GiB in bf16 (vocabulary 32000, hidden 2048, MLP 5632,
11 layers, 16 heads, 4 KV heads, tied embeddings; random weights), saved by
``save_pretrained`` into --workdir with a tiny tokenizer, then written the way
each loader reads it:

  auto                 the directory (safetensors), vLLM's default loader
  fastsafetensors      the same files, load_format="fastsafetensors"
  runai_streamer       the same files, load_format="runai_streamer"
  tensorizer           vLLM's tensorize_vllm_model of the directory
                       (model.tensors), load_format="tensorizer"
  tsar (copy)          ``tsar pack DIR``: fed to vLLM's load_weights, copied
  tsar (shared)        ``tsar-vllm pack DIR``: the runtime layout, bound in
                       place, vLLM's CPU repack skipped (F.linear on the
                       mapped weights)
  tsar (repacked)      the same archive, repack=True: vLLM's oneDNN repack
                       (a private copy per replica)

Each figure is one fresh process (`this file --child`), warm page cache (one
untimed run of each loader first), --runs times, median:
  first token    from the parent's spawn to the first generated token
                 (import vllm, engine start, model load, one decode step)
  model load     vLLM's get_model in the worker (build + weights + vLLM's
                 processing), timed by a bench-only plugin that wraps it
  tokens/s       8 prompts x 64 greedy tokens after the first token
Then --replicas N engines of a loader at once, each in its own processes,
held after their first tokens: summed Pss of every process of every replica.
Greedy tokens of every run are compared with auto's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = ["hello world", "the quick brown fox", "hello there fox jumps", "world hello"] * 2
FIRST, MORE = 1, 64

LOADERS = ["auto", "fastsafetensors", "runai_streamer", "tensorizer", "tsar (copy)",
           "tsar (shared)", "tsar (repacked)"]
PSS_LOADERS = ["auto", "tsar (copy)", "tsar (shared)", "tsar (repacked)"]


def _engine_kwargs(loader, work):
    d = os.path.join(work, "dir")
    common = dict(model=d, enforce_eager=True, max_model_len=256, max_num_seqs=8, seed=0,
                  dtype="bfloat16")
    if loader in ("auto", "fastsafetensors", "runai_streamer"):
        return dict(load_format=loader, **common)
    if loader == "tensorizer":
        return dict(load_format="tensorizer", model_loader_extra_config={
            "tensorizer_uri": os.path.join(work, "model.tensors")}, **common)
    archive = {"tsar (copy)": "model.tsar"}.get(loader, "model.vllm.tsar")
    extra = {"archive": os.path.join(work, archive)}
    if loader == "tsar (repacked)":
        extra["repack"] = True
    return dict(load_format="tsar", model_loader_extra_config=extra, **common)


# --- the child: one engine --------------------------------------------------------------

def child(loader, work, spawned, hold):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(**_engine_kwargs(loader, work))
    params = SamplingParams(temperature=0.0, max_tokens=FIRST, ignore_eos=True, detokenize=False)
    llm.generate(PROMPTS[:1], params, use_tqdm=False)
    first = time.time() - float(spawned)
    params = SamplingParams(temperature=0.0, max_tokens=MORE, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    print("RESULT " + json.dumps({"first_token_s": first,
                                  "tokens_per_s": sum(map(len, tokens)) / seconds,
                                  "tokens": tokens}), flush=True)
    if hold:
        sys.stdin.read()


# --- the timing plugin: vLLM's get_model in the worker -----------------------------------

_PLUGIN = '''
import time


def register():
    import vllm.v1.worker.cpu_model_runner as runner

    inner = runner.get_model
    if getattr(inner, "_bench_timed", False):
        return

    def timed(*args, **kwargs):
        start = time.perf_counter()
        model = inner(*args, **kwargs)
        print(f"BENCH get_model {time.perf_counter() - start:.6f}", flush=True)
        return model

    timed._bench_timed = True
    runner.get_model = timed
'''


def plugin_dir(directory, dist, name, target, sources=None):
    """``directory``, to put on PYTHONPATH: it declares the vllm.general_plugins
    entry point ``name = target`` as the distribution ``dist`` (as ``pip
    install`` of a package with that entry point would), and holds
    ``sources`` ({file name: Python source})."""
    info = os.path.join(directory, f"{dist.replace('-', '_')}-0.0.dist-info")
    os.makedirs(info, exist_ok=True)
    for file, text in (sources or {}).items():
        with open(os.path.join(directory, file), "w") as f:
            f.write(text)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[vllm.general_plugins]\n{name} = {target}\n")
    return directory


def _plugin_dir(work):
    return plugin_dir(os.path.join(work, "plugin"), "tsar-bench-timing", "tsar_bench_timing",
                      "tsar_bench_timing:register", {"tsar_bench_timing.py": _PLUGIN})


def _env(work):
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [_plugin_dir(work)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _spawn(loader, work, env, hold=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", loader, work, repr(time.time())]
    if hold:
        cmd.append("hold")
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def _read(p):
    """(RESULT dict or None, get_model seconds or None, log) once the child has
    printed its RESULT or ended."""
    lines, result, load = [], None, None
    for line in p.stdout:
        lines.append(line)
        if "BENCH get_model " in line:
            load = float(line.rsplit(" ", 1)[1])
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            break
    return result, load, "".join(lines)


def stop_engines(procs):
    """Lets engines held after their tokens go (their stdin closed), kills
    the process group of any still running after 120 s."""
    import signal

    for p in procs:
        if p.poll() is None:
            p.stdin.close()
    for p in procs:
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        p.stdout.close()


def tree_pss_kib(pid) -> int:
    """Summed Pss (KiB) of a replica: its process and every descendant."""
    import psutil

    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0
    for q in procs:
        try:
            total += q.memory_full_info().pss >> 10
        except psutil.NoSuchProcess:
            pass
    return total


def _why(log):
    """The root cause in a failed engine's log: the first exception line
    other than vLLM's own summary of the failure."""
    pattern = re.compile(r"(?:^|\] |\) )((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b.*)")
    found = [m.group(1) for m in map(pattern.search, log.splitlines()) if m]
    found = [f for f in found if "Engine core initialization failed" not in f] or found
    if found:
        return found[0].strip()[:300]
    return log.strip().splitlines()[-1][-300:] if log.strip() else "no output"


# --- preparation --------------------------------------------------------------------------

def prepare(work, log):
    d = os.path.join(work, "dir")
    if not os.path.isfile(os.path.join(d, "config.json")):
        import torch
        import transformers
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(" ".join(PROMPTS).split() * 5, trainers.BpeTrainer(
            vocab_size=100, special_tokens=["[UNK]", "[PAD]", "<s>", "</s>"]))
        transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>",
            eos_token="</s>").save_pretrained(d)
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=11,
            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256,
            tie_word_embeddings=True, bos_token_id=2, eos_token_id=3, pad_token_id=1)
        with torch.device("cpu"):
            model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(d)
        log(f"made {d}: {sum(p.numel() for p in model.parameters()) * 2 / 2**30:.2f} GiB bf16")
    import tsar

    if not os.path.exists(os.path.join(work, "model.tsar")):
        tsar.pack(d, os.path.join(work, "model.tsar"))
    if not os.path.exists(os.path.join(work, "model.vllm.tsar")):
        from tsar import _vllm_cli

        _vllm_cli.pack(d, os.path.join(work, "model.vllm.tsar"), dtype="bfloat16")
    tensors = os.path.join(work, "model.tensors")
    if not os.path.exists(tensors):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--tensorize", work],
                           capture_output=True, text=True, env=_env(work))
        if r.returncode != 0:
            log(f"tensorizer: tensorize_vllm_model failed: {_why(r.stdout + r.stderr)}")
        # vLLM serializes the model after processing it: on the CPU its linear
        # weights are then oneDNN handles, and the file lacks them.
        with tsar.open(os.path.join(work, "model.tsar")) as a:
            weights = sum(t.numel() * t.element_size() for t in a.state_dict().values())
        size = os.path.getsize(tensors) if os.path.exists(tensors) else 0
        if size < weights:
            log(f"tensorizer: model.tensors holds {size / 2**20:.0f} MiB of the "
                f"{weights / 2**20:.0f} MiB of weights (vLLM serializes the processed model; "
                "on the CPU its linear weights are oneDNN handles): not usable here")


def tensorize(work):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.tensorizer import (TensorizerConfig,
                                                             tensorize_vllm_model)

    kwargs = _engine_kwargs("auto", work)
    kwargs.pop("load_format")
    tensorize_vllm_model(EngineArgs(**kwargs),
                         TensorizerConfig(tensorizer_uri=os.path.join(work, "model.tensors")))


# --- the parent ---------------------------------------------------------------------------

def measure(loaders, pss_loaders, replicas, runs, work, log):
    env = _env(work)
    rows, reference = {}, None
    for loader in loaders:
        figures, failure = [], None
        for i in range(runs + 1):  # the first run warms the page cache, untimed
            p = _spawn(loader, work, env)
            result, load, out = _read(p)
            stop_engines([p])
            if result is None:
                failure = _why(out)
                break
            if reference is None:
                reference = result["tokens"]
            if result["tokens"] != reference:
                failure = "greedy tokens differ from auto's"
                break
            if i:
                figures.append((result["first_token_s"], load, result["tokens_per_s"]))
        rows[loader] = {"failure": failure, "runs": figures}
        log(f"{loader}: " + (f"FAILED: {failure}" if failure else
                             ", ".join(f"{f[0]:.1f} s first token, {f[1]:.3f} s load, "
                                       f"{f[2]:.1f} tok/s" for f in figures)))
    pss = {}
    for loader in pss_loaders:
        if rows.get(loader, {}).get("failure"):
            continue
        for n in replicas:
            procs = [_spawn(loader, work, env, hold=True) for _ in range(n)]
            try:
                read = [_read(p) for p in procs]
                ok = all(r[0] is not None for r in read)
                total = sum(tree_pss_kib(p.pid) for p in procs) if ok else None
            finally:
                stop_engines(procs)
            pss[(loader, n)] = total
            log(f"{loader}: {n} replicas: " + (f"{total / 1024:.0f} MiB summed Pss" if ok else
                                                 "FAILED: " + _why(read[0][2])))
    return rows, pss


def report(rows, pss, replicas, weights_mib):
    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    lines = ["| loader | first token (s) | model load (s) | tokens/s | "
             + " | ".join(f"{n} replicas, summed Pss (MiB)" for n in replicas) + " |",
             "|---|---|---|---|" + "---|" * len(replicas)]
    for loader, row in rows.items():
        if row["failure"]:
            lines.append(f"| {loader} | failed: {row['failure'][:160]} |" + " |" * (2 + len(replicas)))
            continue
        first = med([f[0] for f in row["runs"]])
        load = med([f[1] for f in row["runs"]])
        tps = med([f[2] for f in row["runs"]])
        cells = [f"{pss[(loader, n)] / 1024:,.0f}" if pss.get((loader, n)) else "" for n in replicas]
        lines.append(f"| {loader} | {first:.1f} | {'' if load is None else f'{load:.3f}'} | "
                     f"{tps:.1f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Weights: {weights_mib:,.0f} MiB. Medians of the timed runs; Pss summed over "
                 "every process of every replica (front end, engine core, worker).")
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], len(sys.argv) > 5)
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--tensorize":
        tensorize(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tsar-p20"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--replicas", default="2,4")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--pss-loaders", default=",".join(PSS_LOADERS))
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)

    def log(message):
        print(f"p20: {message}", file=sys.stderr, flush=True)

    prepare(args.workdir, log)
    replicas = [int(n) for n in args.replicas.split(",") if n]
    loaders = [x for x in args.loaders.split(",") if x]
    unknown = sorted(set(loaders) - set(LOADERS))
    if unknown:
        ap.error(f"--loaders: unknown {unknown}; expected some of {LOADERS}")
    rows, pss = measure(loaders, [x for x in args.pss_loaders.split(",") if x in loaders],
                        replicas, args.runs, args.workdir, log)
    import tsar

    with tsar.open(os.path.join(args.workdir, "model.tsar")) as a:
        weights = sum(t.numel() * t.element_size() for t in a.state_dict().values()) / 2**20
    table = report(rows, pss, replicas, weights)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
