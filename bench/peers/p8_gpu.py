"""P8 (issue 29): a model file onto a GPU, warm page cache. LLaMA-style bf16
decoders of 2 and 8 GiB (about 9 tensors per layer, tied embeddings), each
loader from its own file to a dict of CUDA tensors, every byte on the device
and the stream synchronized:

- pinned memcpy, the limit: the file's bytes already in one pinned host
  buffer of the file's size, one ``copy_`` to the device (no file read at all);
- tsar ``Archive.state_dict(device="cuda")`` (C++ ``to_device``: staging
  through 64 MiB of pinned buffers filled by the host's cores reading the
  file with ``pread``, on several streams), and the same filled by copying
  out of the archive's mapping (``stage_from="mapping"``, the default until
  2026-11-27: each page of a fresh mapping faulted in);
- tsar ``state_dict(device="cuda", pin="register")``: the archive's own
  mapping page-locked in place once (``cudaHostRegister``, read-only) at the
  first load and kept, every load reading it directly; the registration's
  time is reported under the table;
- safetensors ``load_file(path, device="cuda:0")``;
- ``torch.load(path, mmap=True, weights_only=True)`` then ``.to("cuda")`` of
  every tensor (the tied head goes twice: torch does not keep ties across .to);
- fastsafetensors ``fastsafe_open([path], device="cuda:0", nogds=True)`` (its
  bounce-buffer path; ``nogds=False`` too, where GPUDirect Storage works), and
  the Run:ai streamer ``stream_file(path, device="cuda:0")``, where they import;
- CoreWeave's tensorizer (vLLM's ``--load-format tensorizer``)
  ``TensorDeserializer(path, device="cuda:0")``, eager (its default and
  fastest path: reader threads, 8 for a local file, each reading its tensors
  one by one into a pinned buffer the size of its largest, each copied on the
  thread's own CUDA stream and waited for), its tensors taken from the
  deserializer, a mapping of names to tensors; the file written by
  ``TensorSerializer.write_state_dict`` of the same tensors (the head once).

Then a cold-cache table (``--cold``): each file evicted from the page cache
(``posix_fadvise(DONTNEED)``, no mapping of it alive) before one load, beside
``dd`` of the same file evicted the same way: how close each loader comes to
the disk's rate.

Each loader runs --repeat times after one read of its file (warm cache);
the best and the median are reported as GB/s of the model's tensor bytes,
and each result is compared bit for bit, tensor by tensor, with the archive's
own mapped tensors (so no row measures a loader that loaded something else;
a difference makes the exit status 1). Without a CUDA device it says
so and exits 0 (scripts/gpu-check.sh runs it on a GPU machine).

    python bench/peers/p8_gpu.py --sizes 2,8 --workdir DIR [--out FILE.md] [--repeat 3]
"""
import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

HIDDEN, INTER, VOCAB = 2048, 5632, 32000


def make_state_dict(gib: float) -> Dict[str, torch.Tensor]:
    """A LLaMA-style decoder of about `gib` GiB of bf16; lm_head.weight is the
    embedding's tensor (tied)."""
    per_layer = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN
    layers = max(1, round((gib * 2**30 / 2 - VOCAB * HIDDEN - HIDDEN) / per_layer))
    g = torch.Generator().manual_seed(8)

    def w(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    sd = {"model.embed_tokens.weight": w(VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q", "k", "v", "o"):
            sd[p + f"self_attn.{n}_proj.weight"] = w(HIDDEN, HIDDEN)
        sd[p + "mlp.gate_proj.weight"] = w(INTER, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = w(INTER, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = w(HIDDEN, INTER)
        sd[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    sd["model.norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


def same_bytes(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], names: List[str]) -> bool:
    """Every named tensor bit for bit equal to the reference's (each brought
    back to the host: a swapped or transposed tensor is caught)."""
    for n in names:
        g, w = got[n], want[n]
        if g.shape != w.shape or g.dtype != w.dtype:
            return False
        if not torch.equal(g.detach().cpu().contiguous().view(torch.int16), w.contiguous().view(torch.int16)):
            return False
    return True


def warm(path: str) -> None:
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass


def sync() -> None:
    torch.cuda.synchronize()


# --- the loaders: each returns a dict of CUDA tensors -----------------------------
class TsarLoader:
    """tsar.open(p).state_dict(device="cuda", **kwargs): a fresh archive (and
    mapping) per load, as a server's start; the last load's device_stats
    reported under the table."""

    def __init__(self, **kwargs):
        self.kwargs, self.stats = kwargs, {}

    def __call__(self, path):
        import tsar
        a = tsar.open(path)
        out = a.state_dict(device="cuda", **self.kwargs)
        self.stats[path] = a.device_stats
        return out

    def note(self, path):
        s = self.stats.pop(path, None)
        if not s:
            return None
        return (f"tsar {self.kwargs or 'defaults'}: {s['fill_threads']} fill threads, {s['streams']} "
                f"streams, {s['pinned_bytes'] >> 20} MiB pinned, {s['bytes_direct'] / max(1, s['bytes']):.0%} "
                f"read directly, {s.get('bytes_from_file', 0) / max(1, s['bytes']):.0%} read from the file")


class TsarPortableLoader(TsarLoader):
    """TsarLoader on the portable path (what a process runs beside another
    torch than the accelerator's): the same staging pipeline, its copies made
    by torch's Python API (tsar/_portable_device.py)."""

    def __call__(self, path):
        from tsar import _backend
        accelerator, _backend.accelerator = _backend.accelerator, None
        try:
            return super().__call__(path)
        finally:
            _backend.accelerator = accelerator


class RegisteredOnce:
    """tsar's ``pin="register"``: the archive opened once and its mapping
    registered at the first load, kept registered; later loads copy from it.
    The first load (registration included) is one of the repeats, so the best
    is a later load; the registration's own time is reported beside."""

    def __init__(self):
        self.archives = {}
        self.seconds = {}

    def __call__(self, path):
        import tsar
        a = self.archives.get(path)
        if a is None:
            a = self.archives[path] = tsar.open(path)
        out = a.state_dict(device="cuda", pin="register")
        self.seconds[path] = a.registration_seconds
        return out

    def note(self, path):
        s = self.seconds.get(path)
        a = self.archives.pop(path, None)
        if a is not None:
            a.close()  # unregistered: the next size starts with nothing locked
        return None if s is None else (f"tsar pin=\"register\": registering the mapping "
                                       f"({os.path.getsize(path) / 2**30:.2f} GiB) took {s:.3f} s, "
                                       "once, at the first load")


def safetensors_load_file(path):
    from safetensors.torch import load_file
    return load_file(path, device="cuda:0")


def torch_load_mmap(path):
    sd = torch.load(path, mmap=True, weights_only=True)
    return {k: v.to("cuda") for k, v in sd.items()}


def fastsafetensors_loader(nogds: bool):
    def load(path):
        from fastsafetensors import fastsafe_open
        with fastsafe_open([path], device="cuda:0", nogds=nogds) as f:
            # get_tensor views the loader's device buffer: clone before it closes
            return {k: f.get_tensor(k).clone() for k in f.keys()}
    return load


def runai_loader(path):
    from runai_model_streamer import SafetensorsStreamer
    with SafetensorsStreamer() as s:
        s.stream_file(path, device="cuda:0")
        return {k: v.clone() for k, v in s.get_tensors()}


def tensorizer_loader(path):
    from tensorizer import TensorDeserializer
    with TensorDeserializer(path, device="cuda:0") as d:  # eager: every tensor on the device here
        return dict(d)


def version(dist: str) -> str:
    try:
        if dist == "tsar":  # the build under test, on PYTHONPATH
            import tsar
            return getattr(tsar, "__version__", "(build)")
        from importlib.metadata import version as v
        return v(dist)
    except Exception:
        return "not installed"


class Row:
    def __init__(self, name, calls, fmt, load, dist=None, module=None, pinned=""):
        self.name, self.calls, self.fmt, self.load = name, calls, fmt, load
        self.dist, self.module, self.pinned = dist, module, pinned

    def unavailable(self) -> Optional[str]:
        if self.module:
            try:
                __import__(self.module)
            except Exception as e:  # not installed, or no wheel for this machine
                return f"not measured: {self.module} does not import ({type(e).__name__}: {e})"
        return None


def rows() -> List[Row]:
    return [
        Row("tsar (64 MiB pinned, the default)", 'tsar.open(p).state_dict(device="cuda")', "tsar",
            TsarLoader(), "tsar", "tsar", pinned="64 MiB"),
        Row("tsar stage_from=\"mapping\" (filled from the mapping, not the file)",
            'tsar.open(p).state_dict(device="cuda", stage_from="mapping")', "tsar",
            TsarLoader(stage_from="mapping"), "tsar", "tsar", pinned="64 MiB"),
        Row("tsar (portable path: the copies by torch's Python API)",
            'tsar.open(p).state_dict(device="cuda")  # TSAR_PORTABLE=1, or another torch', "tsar",
            TsarPortableLoader(), "tsar", "tsar", pinned="64 MiB"),
        Row("tsar pin=\"register\" (registered at the first load and kept; best: a later load)",
            'a = tsar.open(p); a.state_dict(device="cuda", pin="register")', "tsar",
            RegisteredOnce(), "tsar", "tsar", pinned="the whole file, once"),
        Row("safetensors load_file", 'load_file(p, device="cuda:0")', "safetensors",
            safetensors_load_file, "safetensors", "safetensors"),
        Row("torch.load(mmap=True) + .to", 'torch.load(p, mmap=True, weights_only=True); v.to("cuda")',
            "pt", torch_load_mmap, "torch"),
        Row("fastsafetensors (nogds)", 'fastsafe_open([p], device="cuda:0", nogds=True)', "safetensors",
            fastsafetensors_loader(True), "fastsafetensors", "fastsafetensors"),
        Row("fastsafetensors (GDS)", 'fastsafe_open([p], device="cuda:0", nogds=False)', "safetensors",
            fastsafetensors_loader(False), "fastsafetensors", "fastsafetensors"),
        Row("Run:ai streamer", 'SafetensorsStreamer().stream_file(p, device="cuda:0")', "safetensors",
            runai_loader, "runai-model-streamer", "runai_model_streamer"),
        Row("tensorizer", 'dict(TensorDeserializer(p, device="cuda:0"))  # eager (lazy_load=False)', "tensorizer",
            tensorizer_loader, "tensorizer", "tensorizer", pinned="per reader thread: its largest tensor"),
    ]


def write_files(sd, base: str) -> Dict[str, str]:
    import tsar
    from safetensors.torch import save_file
    files = {"tsar": base + ".tsar", "safetensors": base + ".safetensors", "pt": base + ".pt",
             "tensorizer": base + ".tensors"}
    if not os.path.exists(files["tsar"]):
        tsar.save(sd, files["tsar"])
    if not os.path.exists(files["safetensors"]):  # safetensors stores no ties: the head once
        save_file({k: v for k, v in sd.items() if k != "lm_head.weight"}, files["safetensors"])
    if not os.path.exists(files["pt"]):
        torch.save(sd, files["pt"])
    if not os.path.exists(files["tensorizer"]):
        try:
            from tensorizer import TensorSerializer
        except Exception:  # not installed here: its row says so
            del files["tensorizer"]
        else:  # a state_dict, the head once (the file keeps no ties); written whole, then renamed
            s = TensorSerializer(files["tensorizer"] + ".tmp")
            s.write_state_dict({k: v for k, v in sd.items() if k != "lm_head.weight"})
            s.close()
            os.rename(files["tensorizer"] + ".tmp", files["tensorizer"])
    return files


def measure_limit(path: str, nbytes: int, repeat: int) -> List[float]:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    with open(path, "rb", buffering=0) as f:  # any nbytes of the file: the bytes do not matter
        f.readinto(memoryview(host.numpy()))
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        sync()
        times.append(time.perf_counter() - t)
    del host, dev
    return times


def dd(path: str) -> None:
    """What dd if=path of=/dev/null bs=16M does: the disk's read rate."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass


def cold_table(files, nbytes, best_limit, say) -> None:
    """One load per loader from a file evicted from the page cache, beside dd
    of the same file evicted the same way (the disk's rate)."""
    say()
    say("Cold page cache: the file evicted (posix_fadvise DONTNEED) before one load each; GB/s of the "
        "model's tensor bytes; x disk = against dd of the same file, evicted the same way.")
    say()
    say("| loader | GB/s | x disk | x limit |")
    say("|---|---|---|---|")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # imported as peers.p8_gpu too
    from p9_warm import evict
    size = os.path.getsize(files["tsar"])
    evict([files["tsar"]])
    t = time.perf_counter()
    dd(files["tsar"])
    disk = size / (time.perf_counter() - t) / 1e9
    say(f"| dd of the .tsar file (bs=16M, to nothing) | {disk:.1f} (of the file's {size / 1e9:.2f} GB) "
        f"| 1.00 | {disk / best_limit:.2f} |")
    for name, fmt, load in (("tsar (the default: pread of the file)", "tsar", TsarLoader()),
                            ("tsar stage_from=\"mapping\"", "tsar", TsarLoader(stage_from="mapping")),
                            ("safetensors load_file", "safetensors", safetensors_load_file)):
        if fmt not in files:
            continue
        evict([files[fmt]])
        torch.cuda.empty_cache()
        sync()
        t = time.perf_counter()
        try:
            got = load(files[fmt])
            sync()
        except Exception as e:
            say(f"| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} | | |")
            continue
        rate = nbytes / (time.perf_counter() - t) / 1e9
        del got
        gc.collect()
        say(f"| {name} | {rate:.1f} | {rate / disk:.2f} | {rate / best_limit:.2f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2,8", help="model sizes in GiB, comma-separated (default 2,8)")
    ap.add_argument("--workdir", required=True, help="where the model files are written (reused)")
    ap.add_argument("--out", help="also write the table here (markdown)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", default="", help="sizes (GiB) of the models to load cold too, "
                    "comma-separated (default none)")
    ap.add_argument("--only", default="", help="only the rows whose name starts with this (e.g. tsar)")
    args = ap.parse_args(argv)
    lines: List[str] = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    if not torch.cuda.is_available():
        say("P8: not measured: no CUDA device here (torch.cuda.is_available() is False); "
            "scripts/gpu-check.sh runs it on a machine with a GPU")
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    different = False
    gpu = torch.cuda.get_device_name(0)
    say(f"# P8: model file to GPU tensors, warm page cache ({time.strftime('%Y-%m-%d')}, {gpu})")
    say()
    say(f"torch {torch.__version__}; " + ", ".join(
        f"{d} {version(d)}" for d in ("tsar", "safetensors", "fastsafetensors", "runai-model-streamer", "tensorizer")))
    say("GB/s = the model's tensor bytes (ties once) / seconds from the call to every byte on the "
        f"device (stream synchronized); best and median of {args.repeat}; x limit = best / best of "
        "the pinned memcpy.")
    for size in (float(s) for s in args.sizes.split(",")):
        sd = make_state_dict(size)
        names = [n for n in sd if n != "lm_head.weight"]
        nbytes = sum(sd[n].numel() * 2 for n in names)
        files = write_files(sd, os.path.join(args.workdir, f"llama-{size:g}g"))
        del sd
        gc.collect()
        import tsar
        want = tsar.open(files["tsar"]).state_dict()  # the reference: the same bytes, mapped
        say()
        say(f"## {size:g} GiB bf16 model: {len(names)} tensors, {nbytes / 1e9:.2f} GB")
        say()
        say("| loader | calls | pinned host memory | GB/s best | GB/s median | x limit | bytes checked |")
        say("|---|---|---|---|---|---|---|")
        warm(files["tsar"])
        limit = measure_limit(files["tsar"], nbytes, args.repeat)
        best_limit = nbytes / min(limit) / 1e9
        say(f"| pinned memcpy (the limit) | `dev.copy_(pinned, non_blocking=True)` | {nbytes >> 20} MiB "
            f"| {best_limit:.1f} | {nbytes / statistics.median(limit) / 1e9:.1f} | 1.00 | n/a |")
        notes = []
        for row in rows():
            if not row.name.startswith(args.only):
                continue
            why = row.unavailable()
            if why:
                say(f"| {row.name} | `{row.calls}` | | {why} | | | |")
                continue
            path = files[row.fmt]
            warm(path)
            times, ok, err = [], None, None
            for _ in range(args.repeat):
                torch.cuda.empty_cache()
                sync()
                t = time.perf_counter()
                try:
                    got = row.load(path)
                    sync()
                except Exception as e:  # a peer's path that does not work on this machine
                    err = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                    break
                times.append(time.perf_counter() - t)
                if ok is None:
                    ok = same_bytes(got, want, names)
                del got
                gc.collect()
            if err:
                say(f"| {row.name} | `{row.calls}` | {row.pinned} | failed: {err} | | | |")
                continue
            best = nbytes / min(times) / 1e9
            say(f"| {row.name} | `{row.calls}` | {row.pinned or 'its own'} | {best:.1f} | "
                f"{nbytes / statistics.median(times) / 1e9:.1f} | {best / best_limit:.2f} | "
                f"{'exact' if ok else 'DIFFERENT'} |")
            if not ok:
                say(f"P8: {row.name} loaded different bytes")
                different = True
            note = row.load.note(path) if hasattr(row.load, "note") else None
            if note:
                notes.append(note)
        for n in notes:
            say()
            say(n)
        if f"{size:g}" in [c.strip() for c in args.cold.split(",") if c.strip()]:
            del want
            gc.collect()
            cold_table(files, nbytes, best_limit, say)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
