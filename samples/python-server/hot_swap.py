#!/usr/bin/python3
"""hot_swap.py [--workers N] [--clients C] [--versions V] [--inputs/--hidden/--depth/--outputs]
             [--json OUT]

Publishes new model versions to a running pre-fork server while a load generator
sends requests, and shows that nothing is dropped and the old versions' memory goes:

1. makes the sample MLP (version 1) in a temporary folder and starts
   `server.py --archive model.tsar --follow` with N workers;
2. C client threads send GET / (the probe input) without pause; each answer
   names its worker and version, and is checked against that version's output
   computed here (every output must be exactly one version's);
3. the workers' summed Pss of the model file's mappings is read (version 1);
4. versions 2..V are published one after another with tsar.save (a new file
   renamed over model.tsar); after the last, once every worker has answered
   from it and a moment has passed, the summed Pss is read again: one copy of
   the last version when the workers have let the old ones go.

Prints requests per version, errors (goal 0), wrong answers (goal 0), the time
from each publish to the first answer on the new version, and Pss before and
after against one copy of the file. Exit status 1 if a goal is missed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--versions", type=int, default=3, help="versions in all, the first included")
    ap.add_argument("--seconds", type=float, default=1.5, help="of load between publishes")
    ap.add_argument("--inputs", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--outputs", type=int, default=16)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)

    import torch
    from compare import file_pss_kib
    import make_model
    import mlp
    import tsar

    work = tempfile.mkdtemp(prefix="tsar-hot-swap.")
    server = None
    try:
        arch, paths = make_model.make(work, a.inputs, a.hidden, a.depth, a.outputs, seed=1)
        archive = paths["tsar"]
        x = torch.linspace(-1.0, 1.0, arch["inputs"]).reshape(1, -1)
        expected = {}

        def expect(version, seed):
            torch.manual_seed(seed)
            net = mlp.build(arch)
            with torch.no_grad():
                net.scale.uniform_(0.5, 1.5)
                expected[version] = net(x)
            return net

        expect(1, 1)
        ready = os.path.join(work, "ready.json")
        server = subprocess.Popen([sys.executable, os.path.join(HERE, "server.py"), "--archive", archive,
                                   "--follow", "--poll", "0.2", "--workers", str(a.workers),
                                   "--ready-file", ready], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while not os.path.exists(ready):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        info = json.load(open(ready))
        url = f"http://127.0.0.1:{info['port']}/"

        lock = threading.Lock()
        served, errors, wrong, first_on = {}, [], [], {}
        last_by_worker = {}
        stop = threading.Event()

        def client():
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(url, timeout=30) as r:
                        ans = json.loads(r.read())
                except (urllib.error.URLError, OSError, ValueError) as e:
                    with lock:
                        errors.append(repr(e))
                    continue
                v = ans["version"]
                y = torch.tensor(ans["output"])
                with lock:
                    served[v] = served.get(v, 0) + 1
                    first_on.setdefault(v, time.monotonic())
                    last_by_worker[ans["worker"]] = v
                    want = expected.get(v)
                    if want is None or not torch.allclose(y, want, rtol=1e-4, atol=1e-5):
                        wrong.append((ans["worker"], v))

        threads = [threading.Thread(target=client, daemon=True) for _ in range(a.clients)]
        for t in threads:
            t.start()
        time.sleep(a.seconds)
        pss_before = sum(file_pss_kib(p, archive, replaced=True) for p in info["workers"]) * 1024
        published = {}
        for v in range(2, a.versions + 1):
            net = expect(v, v)
            published[v] = time.monotonic()
            tsar.save(net, archive)  # a new file renamed over the path
            time.sleep(a.seconds)
        last = a.versions
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every worker has answered from the last version
            with lock:
                if len(last_by_worker) == a.workers and set(last_by_worker.values()) == {last}:
                    break
            time.sleep(0.05)
        time.sleep(0.5)
        pss_after = sum(file_pss_kib(p, archive, replaced=True) for p in info["workers"]) * 1024
        stop.set()
        for t in threads:
            t.join()
        one = os.path.getsize(archive)
        swap_ms = {v: (first_on[v] - published[v]) * 1e3 for v in published if v in first_on}
        figures = {"workers": a.workers, "clients": a.clients, "served": served, "errors": len(errors),
                   "wrong": len(wrong), "publish_to_first_answer_ms": swap_ms,
                   "pss_before": pss_before, "pss_after": pss_after, "file_size": one}
        print(f"{a.workers} workers, {a.clients} clients, {a.versions} versions of a "
              f"{one / 2**20:.1f} MiB archive")
        for v in sorted(served):
            extra = f" (first answer {swap_ms[v]:.0f} ms after the publish)" if v in swap_ms else ""
            print(f"  version {v}: {served[v]} requests{extra}")
        print(f"errors: {len(errors)}   wrong answers: {len(wrong)}")
        print(f"workers' summed Pss of the model file: {pss_before / 2**20:.1f} MiB before "
              f"({pss_before / one:.3f}x one copy), {pss_after / 2**20:.1f} MiB after the last swap "
              f"({pss_after / one:.3f}x one copy of the new version)")
        for e in errors[:5]:
            print("  error:", e)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(figures, f, indent=2)
        ok = not errors and not wrong and set(served) == set(range(1, a.versions + 1)) \
            and pss_after <= 1.05 * one
        return 0 if ok else 1
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
