#!/usr/bin/python3
"""compare.py [--workers N] [--inputs/--hidden/--depth/--outputs ...] [--json OUT]

Makes the sample MLP (make_model.py), then starts server.py twice with N
workers on 127.0.0.1 (a free port each): once over model.tsar (tsar.load_into,
shared mapping), once with --torch-load model.pt (a private copy per worker).
Sends the same POST /predict to each and checks that the answers are equal,
reads every process's Pss from /proc/PID/smaps_rollup while the workers are
up, stops each server (SIGTERM, then SIGKILL after a grace period) and prints
a table. Exit status 0 when the answers are equal and no process is left.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def kib_field(path, field):
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def pss_kib(pid):
    return kib_field(f"/proc/{pid}/smaps_rollup", "Pss")


def file_pss_kib(pid, target, replaced=False):
    """Pss (kB) of the mappings of `target` in process pid (/proc/PID/smaps);
    with `replaced`, also of the files renamed over since ("... (deleted)")."""
    real, inside, total = os.path.realpath(target), False, 0
    names = (real, real + " (deleted)") if replaced else (real,)
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                parts = line.rstrip("\n").split(None, 5)
                inside = len(parts) == 6 and parts[5] in names
            elif inside and head == "Pss:":
                total += int(line.split()[1])
    return total


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def post(port, payload, timeout):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_server(label, server_args, workdir, workers, payload, weights_file, timeout):
    ready_file = os.path.join(workdir, f"ready-{label}.json")
    log_path = os.path.join(workdir, f"server-{label}.log")
    cmd = [sys.executable, os.path.join(HERE, "server.py"), *server_args, "--workers", str(workers),
           "--host", "127.0.0.1", "--port", "0", "--ready-file", ready_file]
    t0 = time.monotonic()
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pids = []
    try:
        while not os.path.exists(ready_file):
            if proc.poll() is not None:
                raise RuntimeError(f"{label} server exited with {proc.returncode}:\n{open(log_path).read()}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{label} server not ready after {timeout:.0f} s:\n{open(log_path).read()}")
            time.sleep(0.05)
        start_s = time.monotonic() - t0
        info = json.load(open(ready_file))
        pids = info["workers"]
        answer = post(info["port"], payload, timeout=60)
        workers_pss = {pid: pss_kib(pid) for pid in pids}
        master_pss = pss_kib(info["master"])
        weights_pss = sum(file_pss_kib(pid, weights_file) for pid in pids) if weights_file else None
        return {"label": label, "port": info["port"], "master": info["master"], "workers": pids,
                "start_s": start_s, "load_s": info["load_s"], "answer": answer,
                "workers_pss_kib": sum(workers_pss.values()), "per_worker_pss_kib": workers_pss,
                "master_pss_kib": master_pss, "archive_pss_kib": weights_pss}
    finally:
        # Bounded shutdown: SIGTERM to the master (it stops its workers), then SIGKILL the group.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--inputs", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--outputs", type=int, default=16)
    ap.add_argument("--workdir", help="where the model files go (default: a temporary folder, removed)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for each server to get ready")
    a = ap.parse_args(argv)

    import make_model
    import mlp
    workdir = a.workdir or tempfile.mkdtemp(prefix="tsar-server-")
    try:
        arch, paths = make_model.make(workdir, a.inputs, a.hidden, a.depth, a.outputs)
        rng = random.Random(1234)
        payload = {"input": [rng.uniform(-1, 1) for _ in range(arch["inputs"])]}
        results = [
            run_server("tsar", ["--archive", paths["tsar"]], workdir, a.workers, payload, paths["tsar"], a.timeout),
            run_server("torch.load", ["--torch-load", paths["pt"]], workdir, a.workers, payload, None, a.timeout),
        ]
    finally:
        if not a.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    mib = lambda kib: kib / 1024  # noqa: E731
    weights = mlp.weight_bytes(arch)
    left = [p for r in results for p in [r["master"], *r["workers"]] if alive(p)]
    equal = results[0]["answer"]["output"] == results[1]["answer"]["output"]
    print(f"model: MLP {arch['inputs']}-{arch['hidden']}x{arch['depth']}-{arch['outputs']}, "
          f"{weights / 2**20:.1f} MiB of float32 weights; {a.workers} workers per server")
    print(f"{'':28} {'workers summed Pss':>19} {'per worker':>11} {'archive pages':>14} {'master Pss':>11} "
          f"{'ready after':>12}")
    for r in results:
        n = len(r["workers"])
        arch_col = f"{mib(r['archive_pss_kib']):9.1f} MiB" if r["archive_pss_kib"] is not None else f"{'-':>13}"
        print(f"{r['label'] + (' (shared mmap)' if r['label'] == 'tsar' else ' (private copies)'):28} "
              f"{mib(r['workers_pss_kib']):15.1f} MiB {mib(r['workers_pss_kib']) / n:7.1f} MiB "
              f"{arch_col:>14} {mib(r['master_pss_kib']):7.1f} MiB {r['start_s']:10.2f} s")
    saved = results[1]["workers_pss_kib"] - results[0]["workers_pss_kib"]
    print(f"tsar saves {mib(saved):.1f} MiB across {a.workers} workers "
          f"(one copy of the weights is {weights / 2**20:.1f} MiB)")
    out = results[0]["answer"]["output"][0]
    print(f"answers equal: {'yes' if equal else 'NO'} (first outputs {', '.join(f'{v:.6g}' for v in out[:4])} ...)")
    if left:
        print(f"processes left running: {left}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"arch": arch, "weight_bytes": weights, "workers": a.workers, "answers_equal": equal,
                       "left_running": left, "results": results}, f, indent=1)
    return 0 if equal and not left else 1


if __name__ == "__main__":
    sys.exit(main())
