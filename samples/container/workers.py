#!/usr/bin/python3
"""workers.py: the run half of run.sh. Starts worker containers on the second
"host" (a podman storage of its own), one request each, and checks them:

- every answer equals the answer of the same model loaded without containers
  and without tsar (the worker's --baseline: torch::jit::load of the model
  saved with its weights), run here by the same worker binary;
- the workers' model-attributable memory: the Pss of their mappings of *.tsar
  files, summed over all of them, at most --pss-goal times the bytes of the
  base archive plus the variant's own layer (one copy: every worker maps the
  base archive from the same unpacked image layer, so the same inode);
- every worker maps the base archive as the same inode. Each container's
  overlay mount is a device of its own, but overlayfs reports the inode of the
  lower layer's file, which is the one whose page-cache pages are mapped.

    workers.py --podman "podman --root R --runroot RR" --worker BIN --ref DIR \
        --base IMAGE:2 --variant IMAGE:2 --own-bytes N [--pss-goal 1.05]

Exit status 0 when every check holds, 1 otherwise.
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile


def stderr_of(proc: subprocess.Popen) -> str:
    f = proc.stderr
    if f is None or proc.poll() is None:
        return "..."
    if f.seekable():
        f.seek(0)
    return f.read()[-2000:]


def answer(proc: subprocess.Popen, what: str) -> str:
    """Waits for the worker's "ready" line, sends one request, returns the answer."""
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.wait(timeout=30)
        raise SystemExit(f"workers.py: {what}: expected 'ready ...', got {line!r} (stderr: {stderr_of(proc)})")
    proc.stdin.write("run\n")
    proc.stdin.flush()
    out = proc.stdout.readline().strip()
    if not out.startswith("out "):
        raise SystemExit(f"workers.py: {what}: expected 'out ...', got {out!r}")
    return out


def reference(worker: str, model: str) -> str:
    """The model loaded the usual way, in a process of its own, no container."""
    p = subprocess.Popen([worker, "--baseline", model, "--model", model], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        return answer(p, f"reference {model}")
    finally:
        p.stdin.close()
        p.wait()


def tsar_mappings(pid: int):
    """{path: (pss_kib, 'dev:inode')} for the process's mappings of *.tsar files."""
    found = {}
    current = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                path = head[5] if len(head) >= 6 else ""
                current = path if path.endswith(".tsar") else None
                if current:
                    pss, ident = found.get(current, (0, f"{head[3]}:{head[4]}"))
                    found[current] = (pss, ident)
            elif current and head[0] == "Pss:":
                pss, ident = found[current]
                found[current] = (pss + int(head[1]), ident)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--podman", required=True, help="the podman command of the second host")
    ap.add_argument("--worker", required=True, help="the worker binary, for the answers without containers")
    ap.add_argument("--ref", required=True, help="build.sh's ref/ (models saved with their weights)")
    ap.add_argument("--base", nargs=2, metavar=("IMAGE", "COUNT"), required=True)
    ap.add_argument("--variant", nargs=2, metavar=("IMAGE", "COUNT"), required=True)
    ap.add_argument("--own-bytes", type=int, required=True,
                    help="bytes of the base archive plus the variant's own layer")
    ap.add_argument("--pss-goal", type=float, default=1.05)
    args = ap.parse_args()
    podman = shlex.split(args.podman)

    want = {"base": reference(args.worker, os.path.join(args.ref, "resnet18_ts.pt")),
            "variant": reference(args.worker, os.path.join(args.ref, "resnet18_ft_ts.pt"))}
    workers, errors = [], []
    for kind, (image, count) in (("base", args.base), ("variant", args.variant)):
        for i in range(int(count)):
            name = f"tsar-{kind}-{i}-{os.getpid()}"
            cmd = podman + ["run", "--rm", "-i", "--read-only", "--network", "none", "--name", name, image]
            err = tempfile.TemporaryFile(mode="w+")  # read on failure; a pipe could fill and block
            errors.append(err)
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
            proc.stderr = err  # for stderr_of
            workers.append((kind, name, proc))
    ok = True
    try:
        # Every worker answers first; only then is Pss read, when all of them
        # map the archives (Pss divides a page among the processes mapping it).
        answers = [answer(proc, name) for _, name, proc in workers]
        rows = []
        for (kind, name, _), got in zip(workers, answers):
            pid = int(subprocess.run(podman + ["inspect", "-f", "{{.State.Pid}}", name], check=True,
                                     capture_output=True, text=True).stdout.strip())
            rows.append((kind, name, got, tsar_mappings(pid)))
        print("| worker | image | answer | same as without containers | Pss of *.tsar mappings | "
              "base archive's dev:inode |")
        print("|---|---|---|---|---|---|")
        total = 0
        inodes = set()
        for kind, name, got, maps in rows:
            pss = sum(p for p, _ in maps.values())
            total += pss
            base_ident = maps.get("/models/resnet18.tsar", (0, "not mapped"))[1]
            if base_ident == "not mapped" or pss == 0:
                print(f"workers.py: {name} does not map the base archive: the weights are not shared")
                ok = False
            inodes.add(base_ident.split(":")[-1])
            same = got == want[kind]
            ok &= same
            print(f"| {name} | {kind} | {got} | {'yes' if same else 'NO: ' + want[kind]} | "
                  f"{pss / 1024:.1f} MiB | {base_ident} |")
        goal = args.pss_goal * args.own_bytes / 1024
        print(f"\nsummed Pss of the workers' archive mappings: {total / 1024:.1f} MiB; base archive + "
              f"variant's own layer: {args.own_bytes / 2**20:.1f} MiB; ratio "
              f"{total * 1024 / args.own_bytes:.3f} (goal at most {args.pss_goal})")
        print(f"the base archive mapped as {len(inodes)} inode(s) by {len(rows)} workers")
        if total > goal:
            print("workers.py: the workers hold more than one copy of the weights")
            ok = False
        if len(inodes) != 1:
            print("workers.py: the workers do not map one and the same base archive")
            ok = False
    finally:
        for _, _, proc in workers:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for _, _, proc in workers:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
