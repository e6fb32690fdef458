#!/usr/bin/env python3
"""P19 (issue 60): process start to first output, warm page cache.

Each case is a fresh process, timed by this harness from the spawn to the
first output it prints (median of --runs, after one untimed run that warms the
page cache); every case's output is checked against the first one's.

The 1 GiB LLaMA (P20's: bf16, 11 layers, hidden 2048, tied embeddings), a
transformers ``save_pretrained`` directory packed once with
``tsar.transformers.pack(..., program="aoti")``:

- ``from_pretrained``: transformers' ``AutoModelForCausalLM.from_pretrained``;
- ``tsar.transformers.load_model``: the archive, bound into transformers' class;
- ``tsar.load_program``: the exported program, torch only (no transformers);
- ``tsar.load_aoti``: the AOTInductor program, from Python, torch only;
- ``tsar_worker --aoti`` (C++): the AOTInductor program, no Python.

ResNet-50 (torchvision, random weights, seed 0), saved with both programs:

- ``torchvision + torch.load``: ``resnet50()`` and ``load_state_dict`` of a
  torch.save file (``mmap=True``);
- ``tsar.load_program``, ``tsar.load_aoti`` and ``tsar_worker --aoti`` as above;
- TorchScript (C++): ``tsar_worker --baseline`` (``torch::jit::load`` of the
  scripted model with its weights) and ``tsar_worker --model ARCH --archive``
  (the weightless architecture bound to the archive).

    PYTHONPATH=build/python .venv/bin/python bench/peers/p19_start.py \\
        --worker build/samples/cpp-server/tsar_worker [--runs 5] [--work /tmp/tsar-p19]

Making the models compiles two AOTInductor programs: minutes on 2 cores, once
(the work directory keeps them).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

SEQ = 16

# Each child loads the model its own way (LOAD: the lines that make ``m``),
# then runs one input and prints "out <sum of the output> [imports transformers]".
LLAMA = r"""
import sys, torch
LOAD
ids = (torch.arange(%d) %% 100 + 1).unsqueeze(0)
with torch.no_grad():
    y = m(ids, ARGS)
    y = getattr(y, "logits", y)
print("out", float(y.float().sum()), "transformers" in sys.modules, flush=True)
""" % SEQ
RESNET = r"""
import sys, torch
LOAD
torch.manual_seed(0)
with torch.no_grad():
    y = m(torch.randn(1, 3, 64, 64))
print("out", float(y.sum()), flush=True)
"""


def child(template, load, args="torch.ones_like(ids)"):
    return template.replace("LOAD", load).replace("ARGS", args)


LLAMA_FROM_PRETRAINED = child(
    LLAMA, "from transformers import AutoModelForCausalLM\n"
    "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).eval()",
    "attention_mask=torch.ones_like(ids)")
LLAMA_TSAR_TRANSFORMERS = child(LLAMA, "import tsar.transformers\n"
                                "m = tsar.transformers.load_model(sys.argv[1])",
                                "attention_mask=torch.ones_like(ids)")
LLAMA_PROGRAM = child(LLAMA, 'import tsar\nm = tsar.load_program(sys.argv[1], "model")')
LLAMA_AOTI = child(LLAMA, 'import tsar\nm = tsar.load_aoti(sys.argv[1], "model_aoti")')
RESNET_TORCHVISION = child(
    RESNET, "import torchvision\nm = torchvision.models.resnet50()\n"
    "m.load_state_dict(torch.load(sys.argv[1], mmap=True, weights_only=True), assign=True)\n"
    "m.eval()")
RESNET_PROGRAM = child(RESNET, 'import tsar\nm = tsar.load_program(sys.argv[1], "model")')
RESNET_AOTI = child(RESNET, 'import tsar\nm = tsar.load_aoti(sys.argv[1], "model_aoti")')


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def make(work):
    import torch

    import tsar

    os.makedirs(work, exist_ok=True)
    llama = os.path.join(work, "llama")
    if not os.path.exists(os.path.join(llama, "config.json")):
        import transformers

        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=11,
            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256,
            tie_word_embeddings=True, bos_token_id=2, eos_token_id=3, pad_token_id=1)
        transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(llama)
        log(f"made {llama}")
    archive = os.path.join(work, "llama.tsar")
    if not os.path.exists(archive):
        import tsar.transformers

        t = time.time()
        summary = tsar.transformers.pack(llama, archive, program="aoti")
        log(f"packed {archive} with its programs in {time.time() - t:.0f} s: {summary.notes[-1]}")
    resnet = os.path.join(work, "resnet50.tsar")
    if not os.path.exists(resnet):
        import torchvision

        torch.manual_seed(0)
        m = torchvision.models.resnet50().eval()
        torch.save(m.state_dict(), os.path.join(work, "resnet50.pt"))
        torch.jit.save(torch.jit.script(m), os.path.join(work, "resnet50_ts.pt"))
        tsar.pack(os.path.join(work, "resnet50_ts.pt"), os.path.join(work, "resnet50_ts.tsar"),
                  arch=os.path.join(work, "resnet50_arch_ts.pt"))
        t = time.time()
        ep = torch.export.export(m, (torch.randn(2, 3, 64, 64),), dynamic_shapes=(
            {0: torch.export.Dim("batch", max=256)},))
        package = tsar.compile_aoti(ep, os.path.join(work, "resnet50.aoti.pt2"))
        tsar.save(m, resnet, programs={"model": ep, "model_aoti": package})
        log(f"exported and compiled ResNet-50 in {time.time() - t:.0f} s")


def first_output(argv, env, stdin_run):
    """Seconds from the spawn to the first "out" line, and that line."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    if stdin_run:
        p.stdin.write("run\n")
        p.stdin.flush()
    try:
        for line in p.stdout:
            if line.startswith("out"):
                elapsed = time.perf_counter() - t
                return elapsed, line.split()
        raise RuntimeError(f"{argv[:3]}: no output: {p.stderr.read()[-2000:]}")
    finally:
        p.stdin.close()
        p.kill()
        p.wait()


def measure(cases, runs, env):
    rows, reference = [], None
    for label, argv, stdin_run in cases:
        times, out = [], None
        for i in range(runs + 1):
            elapsed, out = first_output(argv, env, stdin_run)
            if i:
                times.append(elapsed)
        value = float(out[1])
        if reference is None:
            reference = value
        agree = abs(value - reference) <= 2e-2 * max(1.0, abs(reference))
        extra = " (imports transformers)" if out[2:] == ["True"] else ""
        rows.append((label, statistics.median(times), min(times), value, agree, extra))
        log(f"  {label}: {statistics.median(times):.3f} s (output {value:.4f}{'' if agree else ', DIFFERS'})")
    return rows


def pss_of(pid, path=None):
    """Pss in KiB: the process's whole, or only its mappings of ``path``."""
    total, inside = 0, path is None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                if path is not None:
                    parts = line.rstrip("\n").split(None, 5)
                    inside = len(parts) == 6 and parts[5] == os.path.realpath(path)
            elif inside and head == "Pss:":
                total += int(line.split()[1])
    return total


def replicas(label, argv, n, env, stdin_run, archive=None):
    """Summed Pss of ``n`` processes of ``argv`` after each gave its first
    output (and of their mappings of ``archive``)."""
    procs = []
    try:
        for _ in range(n):
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, env=env)
            if stdin_run:
                p.stdin.write("run\n")
                p.stdin.flush()
            procs.append(p)
        for p in procs:
            for line in p.stdout:
                if line.startswith("out"):
                    break
        total = sum(pss_of(p.pid) for p in procs)
        mapped = sum(pss_of(p.pid, archive) for p in procs) if archive else None
    finally:
        for p in procs:
            p.kill()
            p.wait()
    log(f"  {n} x {label}: summed Pss {total / 1024:,.0f} MiB"
        + (f", of it the archive's pages {mapped / 1024:,.0f} MiB" if archive else ""))
    return label, total, mapped


def table(title, rows, base):
    lines = [f"**{title}**", "", "| process start to first output | median | best | vs "
             f"{base} | output |", "|---|---|---|---|---|"]
    ref = dict((r[0], r[1]) for r in rows)[base]
    for label, med, best, value, agree, extra in rows:
        lines.append(f"| {label}{extra} | {med:.2f} s | {best:.2f} s | {med / ref:.2f}x | "
                     f"{value:.4g}{'' if agree else ' (differs)'} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", required=True, help="build/samples/cpp-server/tsar_worker")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", default="/tmp/tsar-p19")
    ap.add_argument("--replicas", type=int, default=4)
    args = ap.parse_args()
    make(args.work)
    w = args.work
    env = dict(os.environ)
    py = sys.executable
    llama = [
        ("from_pretrained", [py, "-c", LLAMA_FROM_PRETRAINED, f"{w}/llama"], False),
        ("tsar.transformers.load_model", [py, "-c", LLAMA_TSAR_TRANSFORMERS, f"{w}/llama.tsar"], False),
        ("tsar.load_program (torch only)", [py, "-c", LLAMA_PROGRAM, f"{w}/llama.tsar"], False),
        ("tsar.load_aoti (Python, torch only)", [py, "-c", LLAMA_AOTI, f"{w}/llama.tsar"], False),
        ("tsar_worker --aoti (C++)", [args.worker, "--archive", f"{w}/llama.tsar", "--aoti",
                                      "--tokens", str(SEQ)], True),
    ]
    resnet = [
        ("torchvision + torch.load", [py, "-c", RESNET_TORCHVISION, f"{w}/resnet50.pt"], False),
        ("tsar.load_program (torch only)", [py, "-c", RESNET_PROGRAM, f"{w}/resnet50.tsar"], False),
        ("tsar.load_aoti (Python, torch only)", [py, "-c", RESNET_AOTI, f"{w}/resnet50.tsar"], False),
        ("tsar_worker --aoti (C++)", [args.worker, "--archive", f"{w}/resnet50.tsar", "--aoti"], True),
        ("TorchScript: torch::jit::load (C++)", [args.worker, "--baseline", f"{w}/resnet50_ts.pt",
                                                 "--model", f"{w}/resnet50_ts.pt"], True),
        ("TorchScript + tsar::bind (C++)", [args.worker, "--archive", f"{w}/resnet50_ts.tsar",
                                            "--model", f"{w}/resnet50_arch_ts.pt"], True),
    ]
    log("LLaMA 1 GiB:")
    a = measure(llama, args.runs, env)
    held = [replicas("from_pretrained", llama[0][1], args.replicas, env, False),
            replicas("tsar_worker --aoti", llama[4][1], args.replicas, env, True,
                     f"{w}/llama.tsar")]
    log("ResNet-50:")
    b = measure(resnet, args.runs, env)
    print(table("LLaMA, 1.04 GiB bf16", a, "from_pretrained"))
    print()
    print(table("ResNet-50, 98 MiB float32", b, "torchvision + torch.load"))
    print()
    print(f"**LLaMA, {args.replicas} processes after their first output**\n\n"
          "| processes | summed Pss | of it the archive's pages |\n|---|---|---|")
    for label, total, mapped in held:
        print(f"| {args.replicas} x {label} | {total / 1024:,.0f} MiB | "
              f"{'' if mapped is None else f'{mapped / 1024:,.0f} MiB'} |")


if __name__ == "__main__":
    main()
