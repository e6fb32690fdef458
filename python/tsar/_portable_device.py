"""Copies onto a GPU on the portable path (``Archive.state_dict(device=)``,
``load_into(device=)`` beside a torch the accelerator was not built for).

The staging pipeline is the accelerator's own (loader/device_pipeline.h, run by
``_tsar_portable.stage_to_device``, python/src/portable_device.h): host threads
fill bounded pinned buffers from the archive's file (or its mapping) without
the GIL, each buffer's transfer overlapping the next one's fill. What the
accelerator does there in LibTorch's C++, an engine here does with torch's
public Python API: pinned buffers from ``torch.empty(pin_memory=True)``, one
device allocation per archive storage, ``copy_(non_blocking=True)`` on CUDA
streams ordered after the caller's current stream, one event per buffer. The
tensors are then views of their storage's device copy, so views and tied
weights share one device storage again, bytes exact, as on the accelerator.

``pin="register"`` works as on the accelerator: the mapping, page-locked by
tsar/_register.py, is read by the GPU directly on a direct lane (an engine of
its own, on the lane's thread, copying from a CPU tensor over the mapping),
and only what lies outside it is staged.
"""
from __future__ import annotations

import mmap
from typing import Callable, Dict, List, Tuple

import torch

from . import _tsar_portable
from ._errors import Error, ErrorCode
from ._portable_dtypes import as_dtype, torch_dtype


class CudaEngine:
    """The pipeline's copy engine on a CUDA device (the calls of
    loader/device_pipeline.h's CopyEngine, from one thread)."""

    def __init__(self, device: torch.device, sizes: List[int], streams: int, targets=None,
                 locked=None):
        if device.index is None:  # "cuda": the calling thread's device, as the accelerator's
            device = torch.device("cuda", torch.cuda.current_device())
        caller = torch.cuda.current_stream(device)
        # Allocated on the caller's stream, as the accelerator's targets; the
        # copy streams start after everything queued there so far.
        if targets is None:
            with torch.cuda.device(device):
                targets = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
        self.targets, self._device, self._locked = targets, device, locked
        self._streams = [torch.cuda.Stream(device) for _ in range(streams)]
        for s in self._streams:
            s.wait_stream(caller)
        self._pinned: List[torch.Tensor] = []
        self._events: Dict[int, torch.cuda.Event] = {}

    def lane(self, locked: Tuple[torch.Tensor, int]) -> "CudaEngine":
        """A direct lane's engine: the same targets, one stream, copies read
        from ``locked`` (a uint8 CPU tensor over memory page-locked already,
        and its address) instead of pinned buffers."""
        return type(self)(self._device, [], 1, targets=self.targets, locked=locked)

    def enter_thread(self) -> None:
        torch.cuda.set_device(self._device)  # a new thread's device is 0

    def register(self, address: int, n: int) -> bool:
        """Whether [address, address + n), whole pages, lies in the locked
        memory (the mapping's pages, its last one whole; nothing is locked
        here: the lane reads only what pin="register" locked)."""
        t, base = self._locked
        end = base + -(-t.numel() // mmap.PAGESIZE) * mmap.PAGESIZE
        return base <= address and address + n <= end

    def allocate(self, buffer: int, nbytes: int) -> int:
        b = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self._pinned.append(b)
        return b.data_ptr()

    def _slice(self, src: int, n: int) -> torch.Tensor:
        if self._locked is not None:
            t, base = self._locked
            if base <= src and src + n <= base + t.numel():
                return t[src - base:src - base + n]
        for b in self._pinned:
            base = b.data_ptr()
            if base <= src and src + n <= base + b.numel():
                return b[src - base:src - base + n]
        raise Error("to_device: a transfer from outside the staging buffers",
                    ErrorCode.INVALID_ARGUMENT)

    def copy(self, stream: int, src: int, target: int, offset: int, n: int) -> None:
        with torch.cuda.stream(self._streams[stream]):
            self.targets[target][offset:offset + n].copy_(self._slice(src, n), non_blocking=True)

    def record(self, stream: int, buffer: int) -> None:
        event = torch.cuda.Event()
        event.record(self._streams[stream])
        self._events[buffer] = event

    def wait(self, buffer: int) -> None:
        self._events[buffer].synchronize()

    def finish(self) -> None:
        for s in self._streams:
            s.synchronize()


class HostEngine(CudaEngine):
    """The same pipeline into host memory, synchronously: what the tests run
    the portable device path through where no GPU is (targets on the CPU,
    buffers not page-locked, every copy done when it returns)."""

    def __init__(self, device: torch.device, sizes: List[int], streams: int, targets=None,
                 locked=None):
        self.targets = targets if targets is not None else [
            torch.empty(n, dtype=torch.uint8) for n in sizes]
        self._device, self._locked = device, locked
        self._pinned = []
        self.streams = streams
        self.copies = 0
        self.lanes = []  # the direct lanes' engines made from this one

    def lane(self, locked):
        e = super().lane(locked)
        self.lanes.append(e)
        return e

    def enter_thread(self) -> None:
        pass

    def allocate(self, buffer: int, nbytes: int) -> int:
        b = torch.empty(nbytes, dtype=torch.uint8)
        self._pinned.append(b)
        return b.data_ptr()

    def copy(self, stream: int, src: int, target: int, offset: int, n: int) -> None:
        assert 0 <= stream < self.streams
        self.targets[target][offset:offset + n].copy_(self._slice(src, n))
        self.copies += 1

    def record(self, stream: int, buffer: int) -> None:
        pass

    def wait(self, buffer: int) -> None:
        pass

    def finish(self) -> None:
        pass


# load_into(device=)'s staging, as the accelerator's (DeviceOptions' defaults):
# (pinned_bytes, buffers, streams, fill_threads, stage_from_file).
STAGING = (64 << 20, 4, 0, 0, True)

# The engine for each device type: what a copy to that device runs (the tests
# put HostEngine under "cuda" to run this path without a GPU).
ENGINES: Dict[str, Callable] = {"cuda": CudaEngine}


def check_device(path: str, device: torch.device) -> None:
    """The accelerator's refusals (loader/device.cc CheckDevice) in its words."""
    if device.type not in ENGINES:
        raise Error(f"{path}: to_device: only cpu and cuda devices are supported, found {device}",
                    ErrorCode.UNSUPPORTED, path)
    if ENGINES[device.type] is not CudaEngine:
        return
    if not torch.cuda.is_available():
        raise Error(f"{path}: to_device: this torch was built without CUDA (or no CUDA "
                    "device/driver is present); use a CUDA build of torch on a machine with a "
                    "GPU", ErrorCode.UNSUPPORTED, path)
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise Error(f"{path}: to_device: {device}: this machine has {count} CUDA "
                    f"device{'' if count == 1 else 's'}", ErrorCode.INVALID_ARGUMENT, path)


def copy_storages(archive, storages: List[int], device: torch.device,
                  staging: Tuple[int, int, int, int, bool],
                  direct: Tuple[int, int] = (0, 0)) -> Tuple[List[torch.Tensor], dict]:
    """Each of ``storages`` (archive storage numbers) copied once onto
    ``device`` through the staging pipeline: ([a 1-d uint8 tensor of its
    bytes per storage], the stats dict of Archive.device_stats). ``staging``:
    (pinned_bytes, buffers, streams, fill_threads, stage_from_file).
    ``direct``: (address, size) of the archive's mapping page-locked
    already (pin="register"), read by the GPU directly; (0, 0): none."""
    check_device(archive.path, device)
    made = []

    def make_engine(sizes, streams):
        made.append(ENGINES[device.type](device, sizes, streams))
        return made[0]

    make_direct = None
    base, size = direct
    if size:
        mapping = torch.frombuffer(archive._file.mapping_bytes(), dtype=torch.uint8)
        if mapping.data_ptr() != base or mapping.numel() != size:
            raise Error(f"{archive.path}: to_device: the locked range is not this archive's "
                        "mapping", ErrorCode.INVALID_ARGUMENT, archive.path)

        def make_direct():
            return made[0].lane((mapping, base))

    stats = _tsar_portable.stage_to_device(archive._file, storages, make_engine, staging,
                                           make_direct)
    keys = ("bytes", "bytes_direct", "pinned_bytes", "bytes_from_file", "fill_threads", "streams")
    return made[0].targets, dict(zip(keys, stats))


class DeviceViews:
    """The device copies of some of an archive's rows (PortableArchive.table),
    each storage copied once: ``view(row)`` is the tensor ``row`` is, on the
    device, a view of its storage's copy (no requires_grad)."""

    def __init__(self, archive, rows, device: torch.device, staging, direct=(0, 0)):
        storages: Dict[int, int] = {}
        for r in rows:
            if type(r[1]) is str:
                torch_dtype(r[1], archive.path)  # UNSUPPORTED before any copy
            storages.setdefault(r[5], len(storages))
        self._number = storages
        self.targets, self.stats = copy_storages(archive, list(storages), device, staging,
                                                 direct)
        self._flat: Dict[Tuple[int, torch.dtype], torch.Tensor] = {}

    def view(self, row) -> torch.Tensor:
        _, dtype, sizes, strides, offset, storage = row[:6]
        key = (storage, dtype)
        flat = self._flat.get(key)
        if flat is None:
            flat = self._flat.setdefault(key, as_dtype(self.targets[self._number[storage]], dtype))
        return flat.as_strided(sizes, strides, offset)


def to_device(archive, device: str, entry: str, pinned_bytes: int, buffers: int, streams: int,
              fill_threads: int, stage_from_file: bool, direct) -> Tuple[list, dict]:
    """The accelerator's ``_tsar.Archive.to_device`` on the portable path:
    ([(name, tensor on ``device``)] in file order, stats)."""
    target = torch.device(device)
    rows, _ = archive.table(entry)
    dense = [r for r in rows if r[1] is not None]
    views = DeviceViews(archive, dense, target,
                        (int(pinned_bytes), int(buffers), int(streams), int(fill_threads),
                         bool(stage_from_file)), tuple(direct))
    out = []
    for r in rows:
        if r[1] is None:  # sparse: its small component arrays by torch's own copy
            t = archive.view(r).to(target)
        else:
            t = views.view(r)
            if r[6]:
                t.requires_grad_(True)
        out.append((r[0], t))
    return out, views.stats
