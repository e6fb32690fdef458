"""Issue 45, a hostile-input campaign's findings, each input made here at test
time with the error or result expected: symbolic links out of an input
directory (TensorDict, a safetensors index's shards), `inspect`/`residency` of a
small archive that says 65536 ranks, an input truncated while it is packed,
`--shard-plan` files, what the TensorDict importer says it found, pack's
input-content errors, `Archive.shard` with a huge world, and LiveModule's
watcher against BaseException and a slow load."""
import json
import mmap
import os
import resource
import shutil
import struct
import subprocess
import threading
import time

import pytest
import torch

import tsar
from tsar_testutil import evict_from_page_cache, run_cli, wait_for, write_safetensors


# -- TensorDict directories and safetensors indexes, made by hand ----------------

def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def tensordict_dir(path, tensors, nested=None):
    """A directory as TensorDict's memmap() writes it: meta.json naming each key's
    dtype and shape, KEY.memmap with its bytes; `nested`: {key: (tensors, nested)}."""
    os.makedirs(path, exist_ok=True)
    meta = {}
    for key, values in tensors.items():
        meta[key] = {"device": "cpu", "shape": [len(values)], "dtype": "torch.float32",
                     "is_nested": False}
        with open(os.path.join(path, key + ".memmap"), "wb") as f:
            f.write(f32(values))
    for key, (sub, subnested) in (nested or {}).items():
        meta[key] = {"type": "TensorDict"}
        tensordict_dir(os.path.join(path, key), sub, subnested)
    meta.update({"shape": [], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>",
                 "_format_version": 1})
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f)


SECRET = [42.0, 43.0, 44.0, 45.0]  # what a link out of the directory would pack


@pytest.fixture
def td(tmp_path):
    """A good TensorDict directory (w, and nested/b), and a file outside it whose
    bytes would fit w exactly."""
    src = tmp_path / "td"
    tensordict_dir(src, {"w": [1.0, 2.0, 3.0, 4.0]}, {"nested": ({"b": [5.0, 6.0]}, None)})
    os.makedirs(tmp_path / "outside")
    (tmp_path / "outside" / "secret.bin").write_bytes(f32(SECRET))
    return src


def refused(cli, src, tmp_path, code, *needles, args=()):
    out = tmp_path / "out.tsar"
    r = run_cli(cli, "pack", src, "-o", out, "-q", *args, code=code)
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)
    assert not out.exists(), "nothing is written for a refused input"
    return r.stderr


def link(path, target):
    os.unlink(path)
    os.symlink(target, path)


def test_a_memmap_linked_to_etc_passwd_is_refused(cli, td, tmp_path):
    link(td / "w.memmap", "/etc/passwd")
    refused(cli, td, tmp_path, 3, f"tsar: {td}: ", f'"{td}/w.memmap" is a symbolic link to "/etc/passwd"',
            f'which leaves the input directory "{td}"')


def test_a_relative_link_out_of_the_directory_is_refused(cli, td, tmp_path):
    link(td / "w.memmap", "../outside/secret.bin")
    refused(cli, td, tmp_path, 3, f'"{td}/w.memmap" is a symbolic link to "../outside/secret.bin"',
            "leaves the input directory")
    # The same through tsar.pack (the library call the CLI makes).
    with pytest.raises(tsar.Error, match="leaves the input directory") as e:
        tsar.pack(td, tmp_path / "out.tsar")
    assert e.value.code == tsar.ErrorCode.BAD_INPUT
    # --follow-symlinks is the way to say "follow them": the outside bytes are packed.
    run_cli(cli, "pack", td, "-o", tmp_path / "followed.tsar", "-q", "--follow-symlinks")
    assert tsar.open(tmp_path / "followed.tsar")["w"].tolist() == SECRET
    tsar.pack(td, tmp_path / "followed_py.tsar", follow_symlinks=True)  # and from Python
    assert tsar.open(tmp_path / "followed_py.tsar")["w"].tolist() == SECRET


def test_a_nested_level_whose_folder_links_elsewhere_is_refused(cli, td, tmp_path):
    shutil.move(td / "nested", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", td / "nested")  # absolute, out of td
    refused(cli, td, tmp_path, 3, f'"{td}/nested" is a symbolic link to "{tmp_path}/elsewhere"',
            "leaves the input directory")
    # A link that goes out and comes back in (".." above the directory) leaves it too.
    os.unlink(td / "nested")
    shutil.move(tmp_path / "elsewhere", td / "real")
    os.symlink("../td/real", td / "nested")
    refused(cli, td, tmp_path, 3, '"../td/real"', "leaves the input directory")


def test_links_that_stay_inside_are_followed(cli, td, tmp_path):
    os.makedirs(td / "data")
    shutil.move(td / "w.memmap", td / "data" / "w.bin")
    os.symlink("data/w.bin", td / "w.memmap")  # relative, inside
    shutil.move(td / "nested", td / "levels")
    os.symlink(td / "levels", td / "nested")  # absolute, inside
    os.symlink("../data/../data/w.bin", td / "levels" / "x")  # up and down, never above td
    run_cli(cli, "pack", td, "-o", tmp_path / "a.tsar", "-q")
    a = tsar.open(tmp_path / "a.tsar")
    assert a["w"].tolist() == [1.0, 2.0, 3.0, 4.0] and a["nested.b"].tolist() == [5.0, 6.0]
    # The input directory named through a link of its own is the user's choice.
    os.symlink(td, tmp_path / "alias")
    run_cli(cli, "pack", tmp_path / "alias", "-o", tmp_path / "b.tsar", "-q")
    # A loop of links is refused, not followed forever.
    link(td / "w.memmap", "w.memmap")
    refused(cli, td, tmp_path, 3, "symbolic links on the way (a loop of links?)")


def safetensors_index(path):
    """A sharded checkpoint: index.json naming a in s1.safetensors, b in s2."""
    os.makedirs(path)
    write_safetensors(path / "s1.safetensors", {"a": ("F32", [2], f32([1.0, 2.0]))})
    write_safetensors(path / "s2.safetensors", {"b": ("F32", [2], f32([3.0, 4.0]))})
    (path / "index.json").write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    return path / "index.json"


def test_a_symlinked_safetensors_shard_out_of_the_directory_is_refused(cli, tmp_path):
    index = safetensors_index(tmp_path / "m")
    os.makedirs(tmp_path / "outside")
    write_safetensors(tmp_path / "outside" / "s2.safetensors", {"b": ("F32", [2], f32([7.0, 7.0]))})
    run_cli(cli, "pack", index, "-o", tmp_path / "ok.tsar", "-q")
    link(tmp_path / "m" / "s2.safetensors", "../outside/s2.safetensors")
    refused(cli, index, tmp_path, 3, f"tsar: {index}: ",
            f'"{tmp_path}/m/s2.safetensors" is a symbolic link to "../outside/s2.safetensors"')
    # A shard under a folder that links out.
    os.unlink(tmp_path / "m" / "s2.safetensors")
    os.symlink(tmp_path / "outside", tmp_path / "m" / "sub")
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "sub/s2.safetensors"}}))
    refused(cli, index, tmp_path, 3, f'"{tmp_path}/m/sub" is a symbolic link to "{tmp_path}/outside"')
    # Inside, the same layout packs.
    os.unlink(tmp_path / "m" / "sub")
    os.makedirs(tmp_path / "m" / "shards")
    write_safetensors(tmp_path / "m" / "shards" / "s2.safetensors", {"b": ("F32", [2], f32([3.0, 4.0]))})
    os.symlink("shards", tmp_path / "m" / "sub")
    run_cli(cli, "pack", index, "-o", tmp_path / "in.tsar", "-q")
    assert tsar.open(tmp_path / "in.tsar")["b"].tolist() == [3.0, 4.0]


# -- TensorDict: what was found (item 9) -------------------------------------------

def test_the_tensordict_importer_says_what_it_found(cli, td, tmp_path):
    w = td / "w.memmap"
    os.unlink(w)
    os.mkfifo(w)  # must not block
    refused(cli, td, tmp_path, 3, f'expected its bytes in a regular file "{w}", found a FIFO')
    os.unlink(w)
    os.makedirs(w)
    refused(cli, td, tmp_path, 3, f'"{w}", found a directory')
    os.rmdir(w)
    os.symlink("nowhere.bin", w)
    refused(cli, td, tmp_path, 3, f'found a symbolic link "{w}" to "nowhere.bin", which names nothing')
    link(w, "/dev/zero")
    refused(cli, td, tmp_path, 3, 'is a symbolic link to "/dev/zero"', "leaves the input directory")
    os.unlink(w)
    refused(cli, td, tmp_path, 3, "found no such file")
    # A nested level that is a file, and a meta.json that is a FIFO.
    (td / "w.memmap").write_bytes(f32([1.0, 2.0, 3.0, 4.0]))
    shutil.rmtree(td / "nested")
    (td / "nested").write_bytes(b"x")
    refused(cli, td, tmp_path, 3, f'expected its directory "{td}/nested", found a regular file')
    os.unlink(td / "meta.json")
    os.mkfifo(td / "meta.json")
    refused(cli, td, tmp_path, 3, f"{td}/meta.json: not a regular file (it is a FIFO)")


# -- inspect and residency of a 65536-rank archive (item 2) -------------------------

def _limited(limit):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return set_limit


def test_inspect_and_residency_of_65536_ranks_stay_small(cli, tmp_path):
    # A valid format-1.4 archive of ~320 KiB: 65536 ranks, one sharded (empty)
    # tensor, 2000 one-byte storages every rank reads. Before, both commands
    # built 65536 x 2000 byte ranges (2 GiB).
    sd = {"e": torch.empty(0)}
    for i in range(2000):
        sd[f"t{i}"] = torch.tensor([i % 251], dtype=torch.uint8)
    path = tmp_path / "tp.tsar"
    tsar.save(sd, path, tp=65536, shard={"e": 0})
    assert os.path.getsize(path) < 512 << 10

    def run(*args):
        t0 = time.monotonic()
        r = subprocess.run([cli, *args, str(path)], capture_output=True, text=True, timeout=60,
                           preexec_fn=_limited(1 << 30))  # 1 GiB of address space
        assert r.returncode == 0, (args, r.stderr)
        assert time.monotonic() - t0 < 10, args
        return r.stdout

    info = json.loads(run("inspect", "--json"))
    tp = info["tensor_parallel"]
    assert tp["world"] == 65536 and tp["sharded_tensors"] == 1 and tp["by_dim"] == {"0": 1}
    assert tp["replicated_bytes"] == 2000 and tp["sharded_bytes"] == 0 and tp["rank_bytes"] == 2000
    assert "tensor parallel: 65536 ranks" in run("inspect")
    # Every rank reads the 2000 storages: the pages they span.
    page = os.sysconf("SC_PAGE_SIZE")
    pages = set()
    for s in info["storages"]:
        pages.update(range(s["offset"] // page, (s["offset"] + s["nbytes"] + page - 1) // page))
    res = json.loads(run("residency", "--json"))
    assert len(res["ranks"]) == 256 and res["ranks_not_listed"] == 65536 - 256
    assert all(r["pages"] == len(pages) for r in res["ranks"])
    text = run("residency")
    assert "rank 255 of 65536:" in text and "rank 256 of" not in text
    assert "... and 65280 more ranks, not listed (the first 256 are)" in text


def test_residency_counts_a_ranks_own_slices(cli, tmp_path):
    # Two sharded tensors, 4 ranks, slices of 8 KiB (two pages each at 4096
    # alignment) and a whole tensor: rank r reads its slices and the whole one.
    sd = {"a": torch.zeros(4, 2048), "b": torch.ones(4, 2048), "n": torch.ones(10)}
    path = tmp_path / "tp4.tsar"
    tsar.save(sd, path, tp=4, shard={"a": 0, "b": 0}, alignment=4096)
    res = json.loads(run_cli(cli, "residency", "--json", path).stdout)
    page = os.sysconf("SC_PAGE_SIZE")
    assert res["ranks_not_listed"] == 0 and len(res["ranks"]) == 4
    assert all(r["pages"] == 2 * (8192 // page) + 1 for r in res["ranks"]), res["ranks"]
    # Out of the page cache, then rank 1's pages read back one by one (no
    # read-ahead): rank 1 has them all, rank 3 only the whole tensor's page.
    evict_from_page_cache(path)
    if json.loads(run_cli(cli, "residency", "--json", path).stdout)["resident_pages"] != 0:
        pytest.skip("this file system keeps the file's pages cached")
    storages = {i.name: i.storage for i in tsar.open(path).infos()}
    info = {s["id"]: s for s in json.loads(run_cli(cli, "inspect", "--json", path).stdout)["storages"]}
    evict_from_page_cache(path)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    m.madvise(mmap.MADV_RANDOM)
    for name, start, length in (("a", 8192, 8192), ("b", 8192, 8192), ("n", 0, 40)):
        off = info[storages[name]]["offset"] + start
        for p in range(off // page, (off + length + page - 1) // page):
            m[p * page]  # one page in
    ranks = json.loads(run_cli(cli, "residency", "--json", path).stdout)["ranks"]
    m.close()
    assert ranks[1]["resident_pages"] == ranks[1]["pages"] == 5, ranks
    assert ranks[3]["resident_pages"] == 1, ranks


# -- an input truncated while pack reads it (item 3) --------------------------------

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>
/* Truncates $TSAR_TEST_TRUNCATE to 4096 bytes at the $TSAR_TEST_AT-th pwrite:
   before it ($TSAR_TEST_WHEN "before": that write, from the mapping, fails with
   EFAULT) or after it ("after": the next read of the mapping faults, SIGBUS). */
static int calls;
static void maybe_truncate(int after) {
  const char* path = getenv("TSAR_TEST_TRUNCATE");
  const char* at = getenv("TSAR_TEST_AT");
  const char* when = getenv("TSAR_TEST_WHEN");
  if (!path || !at || !when || (when[0] == 'a') != after) return;
  if (!after) ++calls;
  if (calls == atoi(at)) truncate(path, 4096);
  if (after) ++calls;
}
static ssize_t call(const char* name, int fd, const void* buf, size_t n, off_t off) {
  ssize_t (*real)(int, const void*, size_t, off_t) =
      (ssize_t (*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, name);
  maybe_truncate(0);
  const ssize_t r = real(fd, buf, n, off);
  maybe_truncate(1);
  return r;
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) { return call("pwrite", fd, buf, n, off); }
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  return call("pwrite64", fd, buf, n, off);
}
"""


@pytest.fixture(scope="module")
def truncate_shim(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the pwrite shim")
    d = tmp_path_factory.mktemp("shim")
    (d / "shim.c").write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "shim.so"), str(d / "shim.c"), "-ldl"],
                   check=True)
    return str(d / "shim.so")


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("at", [1, 2, 3])
def test_an_input_truncated_while_packed_is_named(cli, tmp_path, truncate_shim, at, when):
    # 24 MiB in one tensor: the writer reads it in 4 MiB chunks, and the input
    # loses all but its first page at the at-th write of the output. Before, pack
    # died of SIGBUS (exit 135: a read of the mapping after the truncation) or
    # blamed the output ("cannot write: Bad address": a write from it).
    src = tmp_path / "big.safetensors"
    n = 6 << 20
    write_safetensors(src, {"w": ("F32", [n], torch.arange(n, dtype=torch.float32).numpy().tobytes())})
    out = tmp_path / "out" / "big.tsar"
    os.makedirs(out.parent)
    env = dict(os.environ, LD_PRELOAD=truncate_shim, TSAR_TEST_TRUNCATE=str(src), TSAR_TEST_AT=str(at),
               TSAR_TEST_WHEN=when)
    r = subprocess.run([cli, "pack", str(src), "-o", str(out), "-q"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert r.stderr.startswith(f"tsar: {src}: changed while being read"), r.stderr
    assert os.listdir(out.parent) == [], "nothing partial is left"
    assert os.path.getsize(src) == 4096


# -- --shard-plan files (item 8) ----------------------------------------------------

@pytest.mark.parametrize("text, words", [
    ('{"shard": {"a.*": 18446744073709551615}}',
     'pattern "a.*": expected an integer dimension -64 to 63 (-1 = last), found 18446744073709551615'),
    ('{"shard": {"a.*": 64}}', "found 64"),
    ('{"shard": {"a.*": -65}}', "found -65"),
    # A pattern given twice: before, the last one silently won.
    ('{"shard": {"a.*": 0, "a.*": 1}}', 'key "a.*" appears twice'),
    ('{"shard": {"a.*": 0}, "shard": {"a.*": 1}}', '"shard" appears twice'),
])
def test_shard_plan_values_are_checked(cli, tmp_path, text, words):
    torch.save({"a.weight": torch.zeros(4, 4)}, tmp_path / "m.pt")
    (tmp_path / "plan.json").write_text(text)
    refused(cli, tmp_path / "m.pt", tmp_path, 2, f"{tmp_path}/plan.json: --shard-plan: ", words,
            args=("--tp", "2", "--shard-plan", tmp_path / "plan.json"))


def test_shard_plan_files_that_never_end_are_refused_at_once(cli, tmp_path):
    torch.save({"a.weight": torch.zeros(4, 4)}, tmp_path / "m.pt")
    os.mkfifo(tmp_path / "fifo.json")  # blocked forever before
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: no disk used
        f.truncate(17 << 20)
    for plan, words in [("/dev/zero", "not a regular file (it is a character device)"),
                        (tmp_path / "fifo.json", "not a regular file (it is a FIFO)"),
                        (big, f"expected a JSON file of at most {16 << 20} bytes, found {17 << 20}")]:
        r = subprocess.run([cli, "pack", str(tmp_path / "m.pt"), "-o", str(tmp_path / "x.tsar"), "--tp", "2",
                            "--shard-plan", str(plan)], capture_output=True, text=True, timeout=20,
                           preexec_fn=_limited(1 << 30))
        assert r.returncode == 2 and f"{plan}: --shard-plan: " in r.stderr and words in r.stderr, r.stderr


# -- pack's input-content errors name the input, exit 3 (item 11) ------------------

def test_input_content_errors_name_the_input_and_exit_3(cli, tmp_path):
    out = str(tmp_path / "out.tsar")
    st = tmp_path / "d70.safetensors"
    write_safetensors(st, {"x": ("F32", [1] * 70, f32([0.5]))})
    e = refused(cli, st, tmp_path, 3, f"tsar: {st}: tensor \"x\": ndim: expected at most 64", "found 70")
    assert out not in e
    # A key with a dot and a nested level that join to the same name.
    td = tmp_path / "collide"
    tensordict_dir(td, {"a.b": [1.0]}, {"a": ({"b": [2.0]}, None)})
    e = refused(cli, td, tmp_path, 3, f'tsar: {td}: tensor "a.b": expected a name unique in entry "model", '
                                      "found it twice")
    assert out not in e
    # A plan whose pattern matches a scalar, or a size it cannot split.
    torch.save({"s": torch.tensor(1.0), "w": torch.ones(4, 4)}, tmp_path / "m.pt")
    e = refused(cli, tmp_path / "m.pt", tmp_path, 3,
                f'tsar: {tmp_path}/m.pt: tensor "s" (matched by "*"): dim 0: expected a tensor of at least '
                "one dimension to split, found a scalar", args=("--tp", "2", "--shard", "*=0"))
    assert "-0 to -1" not in e and out not in e
    refused(cli, tmp_path / "m.pt", tmp_path, 3, f"tsar: {tmp_path}/m.pt: ", "expected a multiple of tp 3",
            args=("--tp", "3", "--shard", "w=0"))


# -- Archive.shard computes the one slice (item 10) ---------------------------------

def test_shard_of_a_huge_world_computes_one_slice(tmp_path):
    # A stride-0 tensor of 2^40 elements in a few hundred bytes; world 4e6. Before,
    # every one of the 4e6 chunks was built: 5.6 s and 2.1 GB.
    n, world = 1 << 40, 4_000_000
    path = tmp_path / "wide.tsar"
    tsar.save({"x": torch.full((1,), 3.0).expand(n)}, path)
    assert os.path.getsize(path) < 4096
    a = tsar.open(path)
    split = -(-n // world)  # torch.chunk's size: ceil(n / world)
    chunks = -(-n // split)
    t0 = time.monotonic()
    first = a.shard("x", 0, world, 0)
    last = a.shard("x", chunks - 1, world, 0)
    assert time.monotonic() - t0 < 0.5
    assert first.shape == (split,) and first.stride() == (0,) and first[0].item() == 3.0
    assert last.shape == (n - (chunks - 1) * split,)
    with pytest.raises(tsar.Error, match=f"rank {chunks}: size {n} of dim 0 gives only {chunks} chunks of {world}"):
        a.shard("x", chunks, world, 0)


def test_shard_equals_torch_chunk_for_every_world_and_dim(tmp_path):
    torch.manual_seed(0)
    sd = {"whole": torch.randn(6, 5), "split": torch.randn(8, 6), "empty": torch.zeros(0, 4),
          "s": torch.tensor(2.0)}
    path = tmp_path / "tp.tsar"
    tsar.save(sd, path, tp=2, shard={"split": 0})
    a = tsar.open(path)
    for name in ("whole", "split", "empty"):
        for dim in (0, 1, -1):
            for world in (1, 2, 3, 4, 7, 16):
                parts = torch.chunk(sd[name], world, dim)
                for rank in range(len(parts)):
                    got = a.shard(name, rank, world, dim)
                    assert got.shape == parts[rank].shape and torch.equal(got, parts[rank]), \
                        (name, dim, world, rank)
                if len(parts) < world and sd[name].shape[dim] > 0:
                    with pytest.raises(tsar.Error, match="gives only"):
                        a.shard(name, len(parts), world, dim)
    with pytest.raises(tsar.Error, match="a scalar \\(0 dimensions\\) has no dimension to split"):
        a.shard("s", 0, 2, 0)


# -- LiveModule's watcher (items 4 and 5, and issue 42's refused version) -----------

DIM = 8


def make_linear():
    with torch.device("meta"):
        return torch.nn.Linear(DIM, DIM).eval()


def publish(path, k):
    tsar.save({"weight": torch.full((DIM, DIM), float(k)), "bias": torch.zeros(DIM)}, path)


def which(module):
    return int(module(torch.ones(1, DIM))[0, 0].item() / DIM)


@pytest.mark.parametrize("where, exc", [("make", SystemExit(3)), ("warm_up", KeyboardInterrupt()),
                                        ("make", GeneratorExit())])
def test_a_base_exception_on_the_watcher_refuses_the_file_and_the_watcher_lives(tmp_path, where, exc):
    path = tmp_path / "m.tsar"
    publish(path, 1)
    state = {"raise": False}

    def maker():
        if where == "make" and state["raise"]:
            raise exc
        return make_linear()

    def warm_up(m):
        if where == "warm_up" and state["raise"]:
            raise exc
        m(torch.ones(1, DIM))

    events = []
    with tsar.LiveModule(path, maker, warm_up=warm_up, poll_interval=0.02, on_event=events.append) as live:
        state["raise"] = True
        publish(path, 2)
        assert wait_for(lambda: len(events) == 1), live.stats()  # the event comes last
        assert live.stats()["refusals"] == 1 and live.version == 1
        assert type(exc).__name__ in live.last_error
        assert events[-1].kind == "refused" and events[-1].version is None  # the file never was version 2
        assert live.stats()["watching"] and live._thread.is_alive()
        state["raise"] = False
        publish(path, 3)
        assert wait_for(lambda: len(events) == 2), live.stats()
        assert live.version == 2 and which(live.get()) == 3
        assert events[-1].kind == "swapped" and events[-1].version == 2


def test_on_event_raising_system_exit_does_not_stop_the_watcher(tmp_path):
    path = tmp_path / "m.tsar"
    publish(path, 1)
    seen = []

    def on_event(e):
        seen.append(e)
        raise SystemExit(1)

    with tsar.LiveModule(path, make_linear, poll_interval=0.02, on_event=on_event) as live:
        for k in (2, 3):
            publish(path, k)
            assert wait_for(lambda: len(seen) == k - 1), k  # the event comes after the swap
            assert which(live.get()) == k
        assert [e.version for e in seen] == [2, 3] and live.stats()["watching"]


def test_ctrl_c_in_check_on_the_callers_thread_propagates_and_refuses_nothing(tmp_path):
    path = tmp_path / "m.tsar"
    publish(path, 1)
    state = {"raise": False}

    def maker():
        if state["raise"]:
            raise KeyboardInterrupt
        return make_linear()

    live = tsar.LiveModule(path, maker, poll_interval=0, inotify=False)
    try:
        state["raise"] = True
        publish(path, 2)
        with pytest.raises(KeyboardInterrupt):
            live.check()
        assert live.stats()["refusals"] == 0 and live.version == 1
        state["raise"] = False
        assert live.check() is True and which(live.get()) == 2  # tried again: not refused
    finally:
        live.close()


def test_close_returns_promptly_during_a_slow_load(tmp_path):
    # A load that takes long (here make(); in the campaign a full verify of a
    # sparse 3 GiB storage, 5.8 s): close() does not wait for it, and what it
    # loads is dropped, never served.
    path = tmp_path / "m.tsar"
    publish(path, 1)
    entered, release = threading.Event(), threading.Event()
    state = {"slow": False}

    def maker():
        if state["slow"]:
            entered.set()
            release.wait(30)
        return make_linear()

    events = []
    live = tsar.LiveModule(path, maker, poll_interval=0.02, on_event=events.append)
    thread = live._thread
    state["slow"] = True
    publish(path, 2)
    assert entered.wait(10)
    t0 = time.monotonic()
    live.close()
    assert time.monotonic() - t0 < 0.5
    assert live.stats()["watching"] is False
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    assert live.version == 1 and which(live.get()) == 1 and events == []


@pytest.mark.parametrize("weights", ["model.safetensors", "model.safetensors.index.json"])
def test_a_transformers_directory_whose_weights_link_out_is_refused(cli, tmp_path, weights):
    """The transformers importer reads several files: the same rule. Its weights
    file (or index) linked out of the directory is refused; its attached files
    linked out are never read (not attached, with a note)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    write_safetensors(outside / "model.safetensors", {"w": ("F32", [len(SECRET)], f32(SECRET))})
    (outside / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["X"], "model_type": "llama"}))
    if weights == "model.safetensors":
        os.symlink(outside / "model.safetensors", src / weights)
    else:  # the index links out; its shard is inside
        write_safetensors(src / "model-00001-of-00001.safetensors",
                          {"w": ("F32", [3], f32([0.0, 0.0, 0.0]))})
        os.symlink(outside / weights, src / weights)
    # (long paths are shortened in messages: the link's name and its target by their start)
    refused(cli, src, tmp_path, 3, f"tsar: {src}: ", "is a symbolic link to",
            f'which leaves the input directory "{src}"')
    # --follow-symlinks packs it (a Hugging Face cache snapshot links its files to ../../blobs).
    run_cli(cli, "pack", src, "-o", tmp_path / "followed.tsar", "-q", "--follow-symlinks")
    with tsar.open(tmp_path / "followed.tsar") as a:
        assert a["w"].tolist() == (SECRET if weights == "model.safetensors" else [0.0, 0.0, 0.0])
