#!/usr/bin/python3
"""A pre-fork HTTP model server (Python standard library + torch + tsar).

  server.py --archive model.tsar    [--workers N] [--port P]   weights mapped from a tsar archive
  server.py --archive model.tsar --follow                      ... and every new version published there
  server.py --torch-load model.pt   [--workers N] [--port P]   baseline: torch.load in every worker
  server.py --transformers model.tsar [--workers N] [--port P] a transformers model packed from its
                                                                save_pretrained directory

The master imports torch, opens one listening socket on 127.0.0.1, and forks N
workers that all accept() on it. Each worker builds the model architecture
without weights (model.json), then either
  --archive:    tsar.load_into(model, archive): the parameters point into the
                read-only, shared mapping of the file; N workers hold ONE copy;
  --torch-load: torch.load + load_state_dict: every worker holds a private copy;
runs one warm-up forward pass (so every weight page is resident) and serves.
With --follow each worker serves through a tsar.LiveModule made after the fork:
a new archive renamed over the path (tsar.save, tsar pack) is verified, bound
into a fresh module, warmed up, then served; each request runs on the version
it started with, and a worker drops the old version's mapping after its last
request on it. Answers then carry "version" (1, 2, ... per worker).
With --transformers each worker calls tsar.transformers.load_model(archive)
and load_tokenizer(archive): the model class, config and tokenizer all come
from the one archive (make_transformers_model.py makes a small one); requests
are text, answers the greedy continuation.

  GET  /          the output for a fixed probe input (linspace(-1, 1, inputs))
  POST /predict   body {"input": [inputs floats]} or {"input": [[...], ...]}
                  (--transformers: {"text": "...", "max_new_tokens": n <= 64})
  GET  /health    {"ok": true, "worker": pid}

Answers are JSON: {"worker": pid, "mode": "tsar" | "torch.load", "output": [[...]]};
--transformers: {"worker", "mode": "transformers", "input_ids", "output_ids", "text"}.
--ready-file PATH: when every worker is ready, PATH gets {"port", "master", "workers"}.
SIGTERM or SIGINT to the master stops the workers and exits; workers also die
with the master (PR_SET_PDEATHSIG).
"""
import argparse
import ctypes
import http.server
import json
import os
import select
import signal
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--archive", help="tsar archive to map and bind (shared, zero copy)")
    src.add_argument("--torch-load", dest="torch_load", help="torch.save file to load in every worker")
    src.add_argument("--transformers", help="tsar archive of a transformers model directory "
                     "(tsar pack MODEL_DIR): tsar.transformers.load_model in every worker")
    ap.add_argument("--follow", action="store_true",
                    help="with --archive: serve each new version published at the path (tsar.LiveModule)")
    ap.add_argument("--poll", type=float, default=1.0, help="--follow: seconds between stat()s of the path")
    ap.add_argument("--arch", help="model.json (default: model.json next to the weights)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 (default): a free port, see --ready-file")
    ap.add_argument("--ready-file", help="write {port, master, workers} here once all workers are ready")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--verbose", action="store_true", help="log every request")
    a = ap.parse_args(argv)
    if a.workers < 1:
        ap.error("--workers must be at least 1")
    weights = a.archive or a.torch_load or a.transformers
    a.arch = a.arch or os.path.join(os.path.dirname(os.path.abspath(weights)), "model.json")
    a.mode = "tsar" if a.archive else "transformers" if a.transformers else "torch.load"
    if a.follow and not a.archive:
        ap.error("--follow needs --archive")
    return a


def die_with_parent():
    """Linux: this process gets SIGTERM when its parent (the master) dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def follow_model(args):
    """A tsar.LiveModule over the archive (made in the worker, after the fork)."""
    import torch
    import mlp
    import tsar
    arch = mlp.load_arch(args.arch)

    def warm_up(net):
        net(torch.zeros(1, arch["inputs"]))  # every weight page resident before it serves

    def on_event(e):
        what = (f"version {e.version}" if e.version is not None
                else "(refused, still serving the last version)")
        sys.stderr.write(f"[worker {os.getpid()}] {e.kind} {e.path}: {what} "
                         f"{e.error or f'in {e.load_ms:.1f} ms'}\n")

    live = tsar.LiveModule(args.archive, lambda: mlp.build(arch, empty=True), warm_up=warm_up,
                           poll_interval=args.poll, on_event=on_event)
    return live, arch


PROMPT = "hello world"  # GET / of a --transformers server


def generate(net, tokenizer, text, max_new_tokens=8):
    """Greedy continuation of ``text``: (input ids, output ids, decoded text)."""
    import torch
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = net.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=tokenizer.eos_token_id)
    new = out[0, ids["input_ids"].shape[1]:].tolist()
    return ids["input_ids"][0].tolist(), new, tokenizer.decode(new)


def load_model(args):
    import torch
    if args.mode == "transformers":
        import tsar.transformers
        net = tsar.transformers.load_model(args.transformers)  # zero copy, eval()
        tokenizer = tsar.transformers.load_tokenizer(args.transformers)
        generate(net, tokenizer, PROMPT)  # warm-up: the weight pages are resident
        return net, {"tokenizer": tokenizer}
    import mlp
    arch = mlp.load_arch(args.arch)
    net = mlp.build(arch, empty=True)  # eval() mode: required over a shared archive
    if args.mode == "tsar":
        import tsar
        tsar.load_into(net, args.archive)  # strict: names, shapes and dtypes must all match
    else:
        state = torch.load(args.torch_load, map_location="cpu")
        net.load_state_dict(state)
        del state
    with torch.no_grad():
        net(torch.zeros(1, arch["inputs"]))  # warm-up: every weight page is now resident
    return net, arch


def probe(arch):
    import torch
    return torch.linspace(-1.0, 1.0, arch["inputs"]).reshape(1, -1)


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "tsar-sample/1.0"

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write(f"[worker {os.getpid()}] {self.address_string()} {fmt % args}\n")

    def reply(self, code, obj):
        body = (json.dumps(obj) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer_text(self, text, max_new_tokens=8):
        ids, new, decoded = generate(self.server.net, self.server.arch["tokenizer"], text,
                                     max_new_tokens)
        return {"worker": os.getpid(), "mode": "transformers", "input_ids": ids,
                "output_ids": new, "text": decoded}

    def answer(self, x):
        import torch
        live = self.server.live
        net, version = live.current() if live else (self.server.net, None)  # one version per request
        with torch.no_grad():
            y = net(x)
        out = {"worker": os.getpid(), "mode": self.server.mode, "output": y.tolist()}
        if live:
            out["version"] = version
        return out

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, {"ok": True, "worker": os.getpid()})
        elif self.path in ("/", "/predict") and self.server.mode == "transformers":
            self.reply(200, self.answer_text(PROMPT))
        elif self.path in ("/", "/predict"):
            self.reply(200, self.answer(probe(self.server.arch)))
        else:
            self.reply(404, {"error": f"no such path {self.path}"})

    def do_POST(self):
        import torch
        if self.path != "/predict":
            self.reply(404, {"error": f"no such path {self.path}"})
            return
        try:
            n = int(self.headers.get("Content-Length", "0"))
            if not 0 < n <= 64 << 20:
                raise ValueError("a JSON body of at most 64 MiB is required")
            body = json.loads(self.rfile.read(n))
            if self.server.mode == "transformers":
                text, steps = body["text"], int(body.get("max_new_tokens", 8))
                if not isinstance(text, str) or not 0 < steps <= 64:
                    raise ValueError('expected {"text": str, "max_new_tokens": 1 to 64}')
                self.reply(200, self.answer_text(text, steps))
                return
            x = torch.tensor(body["input"], dtype=torch.float32)
            if x.dim() == 1:
                x = x.unsqueeze(0)
            if x.dim() != 2 or x.shape[1] != self.server.arch["inputs"]:
                raise ValueError(f"input must have {self.server.arch['inputs']} values per row")
        except (ValueError, KeyError, TypeError) as e:
            self.reply(400, {"error": str(e)})
            return
        self.reply(200, self.answer(x))


def worker_main(args, listener, ready_fd):
    """Runs in a forked worker; never returns."""
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's to handle
        die_with_parent()
        if os.getppid() == 1:
            os._exit(1)
        import torch
        torch.set_num_threads(args.threads)
        t0 = time.monotonic()
        live = None
        if args.follow:
            live, arch = follow_model(args)
            net = None
        else:
            net, arch = load_model(args)
        load_s = time.monotonic() - t0
        httpd = http.server.HTTPServer((args.host, 0), Handler, bind_and_activate=False)
        httpd.socket.close()
        httpd.socket = listener
        httpd.server_name, httpd.server_port = args.host, listener.getsockname()[1]
        httpd.net, httpd.arch, httpd.mode, httpd.verbose = net, arch, args.mode, args.verbose
        httpd.live = live
        os.write(ready_fd, f"{os.getpid()} {load_s:.4f}\n".encode())
        os.close(ready_fd)
        while True:  # the classic pre-fork loop: the kernel hands each connection to one worker
            try:
                conn, addr = listener.accept()
            except InterruptedError:
                continue
            try:
                httpd.process_request(conn, addr)
            except Exception:  # noqa: BLE001 - one bad request must not kill the worker
                httpd.handle_error(conn, addr)
                httpd.shutdown_request(conn)
    except BaseException as e:  # noqa: BLE001
        sys.stderr.write(f"[worker {os.getpid()}] {type(e).__name__}: {e}\n")
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


class Stop(Exception):
    pass


def stop_workers(pids, grace=5.0):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    left = set(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.discard(pid)
        time.sleep(0.02)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def main(argv=None):
    args = parse_args(argv)
    import torch  # noqa: F401 - imported before fork: its pages are shared by every worker
    if args.mode == "tsar":
        import tsar  # noqa: F401
    elif args.mode == "transformers":
        import tsar.transformers  # noqa: F401 - and transformers, shared by the workers
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))
    listener.listen(128)
    port = listener.getsockname()[1]

    def on_signal(signum, frame):
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ready_r, ready_w = os.pipe()
    pids = []
    status = 0
    try:
        for _ in range(args.workers):
            pid = os.fork()
            if pid == 0:
                os.close(ready_r)
                worker_main(args, listener, ready_w)
            pids.append(pid)
        os.close(ready_w)
        # Wait until every worker has loaded its weights (or one failed).
        ready, buf, deadline = {}, b"", time.monotonic() + args.start_timeout
        while len(ready) < len(pids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {args.start_timeout:.0f} s")
            r, _, _ = select.select([ready_r], [], [], 0.5)
            if r:
                chunk = os.read(ready_r, 4096)
                if not chunk:
                    raise RuntimeError("a worker failed before it was ready (see its message above)")
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    wpid, load_s = line.decode().split()
                    ready[int(wpid)] = float(load_s)
            for pid in pids:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    pids.remove(pid)
                    raise RuntimeError(f"worker {pid} exited before it was ready")
        os.close(ready_r)
        info = {"port": port, "master": os.getpid(), "workers": pids, "mode": args.mode,
                "load_s": [ready[p] for p in pids]}
        if args.ready_file:
            tmp = args.ready_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(info, f)
            os.replace(tmp, args.ready_file)
        print(f"serving {args.mode} on http://{args.host}:{port}/ with {len(pids)} workers "
              f"(pids {' '.join(map(str, pids))})", flush=True)
        while True:
            pid, st = os.wait()
            pids.remove(pid)
            print(f"worker {pid} died ({st:#x}); stopping", file=sys.stderr, flush=True)
            status = 1
            break
    except Stop as e:
        print(f"{e}: stopping {len(pids)} workers", file=sys.stderr, flush=True)
    except RuntimeError as e:
        print(f"server.py: {e}", file=sys.stderr, flush=True)
        status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_workers(pids)
        listener.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
