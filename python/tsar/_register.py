"""Archive.state_dict(device=, pin="register"): the archive's own mapping
page-locked once, in place and read-only, and copied from directly.

The default GPU path (``pin="stage"``, C++ ``to_device``) copies the mapping
into bounded pinned buffers on the host's cores, then to the GPU: its speed is
the host's (first-touch faults of a fresh mapping, then memcpy: 0.64x of a
PCIe 5 link on a 16-core H100 host, bench/results/gpu/). Registered, the
archive's page-cache pages are what the GPU's copy engine reads: no host copy,
at the link's limit (55 GB/s measured there), for every load after the first.
The first load pays the registration (cudaHostRegister faults in and locks
every page of the file: 0.13 s for 4 GiB there), and the pages stay locked
while the Archive lives, so this is for a process that loads one archive onto
GPUs more than once: hot swap back and forth, several GPUs, several ranks.
The pages stay the page cache's: processes that register the same file still
share them (cudaHostRegisterReadOnly; no copy-on-write is taken).
"""
from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Optional

import torch

from ._errors import Error, ErrorCode

_READ_ONLY = 8  # cudaHostRegisterReadOnly
_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device of the process
_lock = threading.Lock()


class Registration:
    """The archive's mapping registered with CUDA; unregistered when the
    Archive that made it is closed or collected (weakref.finalize runs before
    the Archive's attributes are released, so its mapping is still there)."""

    def __init__(self, archive):
        a = archive._a()
        if len(archive.layers) > 1:  # the archive itself, then its bases
            raise Error(f"{archive.path}: pin=\"register\": a layered archive maps its base "
                        f"separately ({', '.join(archive.layers[1:])}); use pin=\"stage\"",
                        ErrorCode.UNSUPPORTED, archive.path)
        base, size = int(a.data_ptr), int(a.mapped_size)
        if base == 0 or size == 0:
            raise Error(f"{archive.path}: pin=\"register\": the archive is not mapped "
                        f"(mode=\"{archive.mode}\"); open it with mode=\"shared\"",
                        ErrorCode.UNSUPPORTED, archive.path)
        self.base, self.size = base, size
        cudart = torch.cuda.cudart()
        start = time.perf_counter()
        err = int(cudart.cudaHostRegister(base, size, _READ_ONLY | _PORTABLE))
        self.seconds = time.perf_counter() - start
        if err != 0:
            raise Error(f"{archive.path}: pin=\"register\": cudaHostRegister of {size} bytes "
                        f"failed with CUDA error {err} (locked memory limit, ulimit -l?); "
                        f"use pin=\"stage\"", ErrorCode.IO, archive.path)
        self._finalizer = weakref.finalize(archive, _unregister, cudart, base)


def _unregister(cudart, base) -> None:
    cudart.cudaHostUnregister(base)


def registration(archive) -> Registration:
    """The archive's registration, made on first use."""
    with _lock:
        r = getattr(archive, "_registration", None)
        if r is None:
            r = Registration(archive)
            archive._registration = r
        return r


def release(archive) -> None:
    with _lock:
        r = getattr(archive, "_registration", None)
        if r is not None:
            r._finalizer()
            archive._registration = None


def to_device(archive, entry: Optional[str], device: torch.device):
    """Every tensor of ``entry`` on ``device``, copied from the registered
    mapping: each storage once (its whole bytes), on the current stream, then
    the views rebuilt over the device storages (ties and views stay views of
    one device storage). Synchronizes the stream before returning, as the
    staged path does."""
    registration(archive)
    host = collections.OrderedDict(archive._a().state_dict(entry or ""))  # views of the mapping
    on_device = {}
    with torch.cuda.device(device):
        for t in host.values():
            if t.layout != torch.strided:
                continue
            s = t.untyped_storage()
            key = s.data_ptr()
            if key not in on_device:
                src = torch.empty(0, dtype=torch.uint8).set_(s)
                dst = torch.empty(s.nbytes(), dtype=torch.uint8, device=device)
                dst.copy_(src, non_blocking=True)
                on_device[key] = dst
        out = collections.OrderedDict()
        for name, t in host.items():
            if t.layout != torch.strided:  # a sparse tensor: torch's own copy
                out[name] = t.to(device)
                continue
            d = on_device[t.untyped_storage().data_ptr()]
            out[name] = torch.empty(0, dtype=t.dtype, device=device).set_(
                d.untyped_storage(), t.storage_offset(), t.shape, t.stride())
            if t.requires_grad:
                out[name].requires_grad_(True)
        torch.cuda.current_stream(device).synchronize()
    return out
