"""load_into(read_ahead=True): on an archive evicted from the page cache, the
bytes the module binds arrive without the module touching them (on both
paths); by default
they stay on the disk until touched; a rank reads its own slices, not its
neighbours' (loader/read_ahead.h)."""
import ctypes
import mmap
import os
import time

import pytest
import torch

import tsar
from tsar_testutil import evict_from_page_cache, mapped_ranges, smaps_of_file

_libc = ctypes.CDLL(None, use_errno=True)
PAGE = mmap.PAGESIZE


def cached(path, start=0, end=None):
    """How many pages of the file's bytes [start, end) are in the page cache."""
    size = os.path.getsize(path)
    end = size if end is None else end
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        anchor = ctypes.c_char.from_buffer(m)  # the mapping's address; reads no page
        try:
            first, last = start // PAGE, (end + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * (last - first))()
            addr = ctypes.addressof(anchor) + first * PAGE
            if _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t((last - first) * PAGE), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return sum(b & 1 for b in vec)
        finally:
            del anchor


def evict(path):
    evict_from_page_cache(path)
    if cached(path):
        pytest.skip("the page cache cannot be evicted here (tmpfs?)")


def wait_cached(path, start, end, timeout=20.0):
    want = (end - start + PAGE - 1) // PAGE
    deadline = time.monotonic() + timeout
    while cached(path, start, end) < want and time.monotonic() < deadline:
        time.sleep(0.01)
    return cached(path, start, end) == want


class Wide(torch.nn.Module):
    def __init__(self, world=1):
        super().__init__()
        self.a = torch.nn.Linear(1024, 2048 // world, bias=False)  # 8 MiB over every rank
        self.b = torch.nn.Linear(1024, 1024, bias=False)           # 4 MiB, whole on each rank


def file_range(path, tensor):
    """[start, end) of the file's bytes that a bound contiguous tensor views."""
    (lo, _), = mapped_ranges(path)  # the archive's one mapping, from offset 0
    start = tensor.data_ptr() - lo
    return start, start + tensor.numel() * tensor.element_size()


@pytest.fixture()
def saved(tmp_path):
    torch.manual_seed(0)
    path = str(tmp_path / "wide.tsar")
    tsar.save(Wide(), path)
    return path


@pytest.fixture(params=["running", "portable"])
def path_taken(request, monkeypatch):
    """The path this process runs, and the portable path (tsar/_portable_bind.py)."""
    if request.param == "portable":
        from tsar import _backend

        monkeypatch.setattr(_backend, "accelerator", None)
    return request.param


def test_load_into_reads_what_it_binds_ahead_of_any_touch(saved, path_taken):
    evict(saved)
    module = Wide().eval()
    tsar.load_into(module, saved, read_ahead=True)
    for start, end in (file_range(saved, module.a.weight), file_range(saved, module.b.weight)):
        assert wait_cached(saved, start, end), f"bytes [{start}, {end}) not read ahead"
    assert torch.equal(module.a.weight, tsar.load(saved)["a.weight"])


def test_by_default_the_pages_wait_for_their_first_touch(saved):
    evict(saved)
    module = Wide().eval()
    tsar.load_into(module, saved)
    time.sleep(0.3)
    start, end = file_range(saved, module.a.weight)
    assert cached(saved, start, end) * PAGE < (end - start) // 4  # the index's neighbours at most
    float(module.a.weight.detach().sum())  # the first touch reads them
    assert cached(saved, start, end) == (end - start) // PAGE


def test_a_rank_reads_ahead_its_own_slices_only(tmp_path, tsar_path):
    torch.manual_seed(0)
    path = str(tmp_path / "tp.tsar")
    tsar.save(Wide(), path, tp=2, shard={"a.weight": 0})  # a: 4 MiB per rank; b: 4 MiB, replicated
    evict(path)
    rank1 = Wide(world=2).eval()
    tsar.load_into(rank1, path, rank=1, world=2, read_ahead=True)
    start, end = file_range(path, rank1.a.weight)  # rank 1's run of 4 MiB
    assert end - start == 4 << 20
    assert wait_cached(path, start, end)
    assert wait_cached(path, *file_range(path, rank1.b.weight))
    # The thread maps what the rank binds into this process, untouched by it,
    # and not rank 0's run (the kernel's read-around may cache some of that,
    # but only a touch would map it): 8 MiB, and at most a large folio more.
    rss = smaps_of_file("self", path)["Rss"] << 10
    assert (8 << 20) <= rss <= (10 << 20), rss
