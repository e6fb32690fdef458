"""pin="register" (Archive.state_dict(device=), load_into(device=)): the
archive's own mapping page-locked once, in place and read-only, and read by
the GPU directly (C++ to_device's direct lane, told the locked range).

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

import threading
import time
import weakref

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
