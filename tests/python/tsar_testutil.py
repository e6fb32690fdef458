"""Helpers shared by the Python tests of tsar (imported by the test modules;
pytest puts this folder on sys.path)."""
import json
import os
import time
import struct
import subprocess
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every dtype of PyTorch 1.13 that tsar's format has a code for (spec §5.1).
# torch 2.x adds the float8 formats of FP8 checkpoints and the wide unsigned ints
# (codes 14-18), then the fnuz float8 variants, the MX scale float8_e8m0fnu and
# the packed FP4 pair float4_e2m1fn_x2 (codes 19-22, format 1.3).
# The dtypes newer than torch 2.1's, those this torch has (float8_e8m0fnu
# came with 2.7, float4_e2m1fn_x2 with 2.8).
NEW_DTYPES = [d for d in (getattr(torch, n, None) for n in (
    "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2")) if d is not None]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128,
          torch.complex32] + NEW_DTYPES

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    """The tensor's elements as integers of the same width (a view, any strides),
    so that comparisons are bit-exact (NaN, -0.0) and work for every dtype."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(_INT_OF_SIZE[t.element_size()])


def same_tensor(got, want):
    """dtype, shape, strides and every bit equal; returns a reason or ''."""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} vs {want.dtype}"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
    if tuple(got.stride()) != tuple(want.stride()):
        return f"strides {got.stride()} vs {want.stride()}"
    if not torch.equal(bits(got), bits(want)):
        return "values differ"
    return ""


def make_tensor(dtype, shape, seed):
    """Deterministic values of any dtype, with special floats where they exist."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    if dtype in NEW_DTYPES:  # every bit pattern: NaNs, the largest unsigned values
        size = torch.empty((), dtype=dtype).element_size()
        flat = torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8).view(dtype)
    elif dtype == torch.bool:
        flat = torch.randint(0, 2, (n,), generator=g).bool()
    elif dtype == torch.complex32:
        flat = (torch.randn(n, 2, generator=g) * 100).half().view(torch.complex32).reshape(n)
    elif dtype.is_complex:
        flat = torch.randn(n, generator=g, dtype=dtype) * 1000
    elif dtype.is_floating_point:
        flat = (torch.randn(n, generator=g, dtype=torch.float64) * 1000).to(dtype)
        specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0], dtype=dtype)
        k = min(n, len(specials))
        flat[:k] = specials[:k]
    else:
        info = torch.iinfo(dtype)
        lo, hi = max(info.min, -2**62), min(info.max, 2**62)
        flat = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)
        if n >= 2:
            flat[0], flat[1] = info.min, info.max
    return flat.reshape(shape)


def all_parameters(module):
    """{qualified name: Parameter}, tied parameters under every name they have."""
    out = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for name, p in mod._parameters.items():
            if p is not None:
                out[f"{mod_name}.{name}" if mod_name else name] = p
    return out


def evict_from_page_cache(path):
    """Writes the file back and drops its pages from the page cache
    (posix_fadvise DONTNEED only drops clean pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def mapped_ranges(path, pid="self"):
    """[(start, end)] of every mapping of the file `path` in process `pid`."""
    real = os.path.realpath(path)
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) == 6 and parts[5] == real:
                lo, hi = parts[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def in_mapping(ptr, ranges):
    return any(lo <= ptr < hi for lo, hi in ranges)


def smaps_of_file(pid, path):
    """{field: kB} summed over every mapping of `path` in /proc/PID/smaps."""
    real = os.path.realpath(path)
    sums, inside = {}, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                parts = line.rstrip("\n").split(None, 5)
                inside = len(parts) == 6 and parts[5] == real
            elif inside and head.endswith(":"):
                fields = line.split()
                if len(fields) >= 2 and fields[1].isdigit():
                    sums[head[:-1]] = sums.get(head[:-1], 0) + int(fields[1])
    return sums


def smaps_rollup(pid):
    """{field: kB} of /proc/PID/smaps_rollup."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2 and fields[0].endswith(":") and fields[1].isdigit():
                out[fields[0][:-1]] = int(fields[1])
    return out


def child_env():
    env = dict(os.environ)
    env.pop("PYTHONFAULTHANDLER", None)
    # The package under test must be importable in children as in this process.
    import tsar
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(tsar.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_cli(cli, *args, code=0, env=None):
    """Runs the tsar command line; asserts its exit code and returns the result (text)."""
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, env=env)
    assert r.returncode == code, (args, r.stdout, r.stderr)
    return r


def release_holders(procs, timeout=30.0):
    """Lets children that hold an archive until their stdin closes go
    (closing it), waits for them at most ``timeout`` seconds in all, and
    kills those still running then."""
    for p in procs:
        if p.poll() is None:
            p.stdin.close()
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_python(code, *args, timeout=120):
    """Runs `python -c code args...` and returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=child_env())


def reference_decoder():
    """The spec's independent reference decoder (spec/reference/tsar_ref.py)."""
    sys.path.insert(0, os.path.join(REPO, "spec", "reference"))
    try:
        import tsar_ref
    finally:
        sys.path.pop(0)
    return tsar_ref


def write_safetensors(path, tensors, metadata=None):
    """A safetensors file: the 8-byte little-endian header size, the JSON
    header (padded with spaces to a multiple of 8), then the data. `tensors`
    maps each name to (dtype code, shape, raw bytes), laid out in order."""
    header, chunks, offset = {}, [], 0
    for name, (code, shape, raw) in tensors.items():
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def wait_for(cond, timeout=10.0):
    """Polls cond() every 10 ms until it is true or `timeout` seconds pass; its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def load_bert_bit_exact(archive, model_dir, ids):
    """tsar.transformers.load_model(archive) of a BERT packed from model_dir,
    its outputs asserted bit-exact with AutoModel.from_pretrained(model_dir)'s
    on `ids`: (the model, the reference)."""
    import torch
    import transformers
    import tsar.transformers as tt

    reference = transformers.AutoModel.from_pretrained(model_dir).eval()
    model = tt.load_model(archive)
    assert type(model) is transformers.BertModel
    with torch.no_grad():
        got, want = model(ids), reference(ids)
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)
    assert torch.equal(got.pooler_output, want.pooler_output)
    return model, reference

