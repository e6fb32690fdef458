"""``pin=`` of a copy onto a GPU (``Archive.state_dict(device=)``,
``load_into(device=)``): how the archive's bytes reach the GPU's copy engine.

- ``"auto"`` (the default): two kinds of lane feed the link at once. The
  staging lane copies the mapping into bounded pinned buffers on the host's
  cores; a direct lane page-locks a window of the mapping in place, read-only
  (``cudaHostRegister``), has the GPU read it with no host copy, and unlocks it
  once read. The staging lane takes windows from the front of the archive, the
  direct lane from the back, each as fast as it goes, until they meet: on a
  16-core host neither alone fills a PCIe 5 link (staging is limited by the
  host's copy, about 47 GB/s; locking by the kernel's page pinning). At most
  4 windows of 64 MiB are locked at once, beside 64 MiB of pinned buffers.
- ``"stage"``: the staging lane alone (the pinned memory only).
- ``"window"``: direct lanes alone (the staging lane takes only a window that
  cannot be locked).
- ``"register"``: the whole mapping locked once, kept so while the Archive is
  open (:mod:`tsar._register`), and read directly by every load: for a process
  that loads one archive onto GPUs more than once. The first load pays the
  locking (:attr:`Archive.registration_seconds`); later loads with ``"auto"``
  or ``"window"`` read the locked mapping directly too.

Page-cache pages stay shared between processes in every mode
(``cudaHostRegisterReadOnly`` takes no private copy).
"""
from __future__ import annotations

from typing import Tuple

import torch

from ._errors import Error, ErrorCode

PINS = ("auto", "stage", "window", "register")


def check_pin(pin) -> None:
    if pin not in PINS:
        raise ValueError(f"pin: expected one of {', '.join(repr(p) for p in PINS)}, found {pin!r}")


def direct_args(archive, pin: str, device: str, *, direct_lanes: int = 0,
                window_bytes: int = 64 << 20, windows: int = 4) -> Tuple:
    """The C++ extension's direct-lane tuple (python/src/module.cc DirectArgs):
    (direct_lanes, staging, window_bytes, windows, locked_base, locked_size).
    ``pin="register"`` locks the mapping here, once."""
    check_pin(pin)
    lanes, staging, base, size = int(direct_lanes), True, 0, 0
    kept = getattr(archive, "_registration", None)
    if kept is not None and pin != "stage":  # locked by an earlier pin="register": read it directly
        base, size = kept.base, kept.size
    if pin == "stage":
        lanes = -1
    elif pin == "window":
        staging = False
    elif pin == "register":
        from . import _register
        if not torch.cuda.is_available() or torch.device(device).type != "cuda":
            raise Error(f"{archive.path}: pin=\"register\" needs a CUDA device, found "
                        f"{device!r}" + ("" if torch.cuda.is_available() else
                                         " (no CUDA device/driver is present)"),
                        ErrorCode.UNSUPPORTED, archive.path)
        r = _register.registration(archive)
        staging, base, size = False, r.base, r.size
    return (lanes, staging, int(window_bytes), int(windows), base, size)


NO_DEVICE = (0, True, 64 << 20, 4, 0, 0)  # a CPU bind's (unused) direct-lane tuple
