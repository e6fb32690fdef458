"""``pin=`` of a copy onto a GPU (``Archive.state_dict(device=)``,
``load_into(device=)``): how the archive's bytes reach the GPU's copy engine.

- ``"stage"`` (the default): host threads copy the mapping into bounded
  pinned buffers (64 MiB), each buffer's transfer overlapping the next one's
  fill (C++ ``to_device``'s staging pipeline).
- ``"register"``: the archive's whole mapping is page-locked once, read-only,
  in place (:mod:`tsar._register`), kept so while the Archive is open, and
  read by the GPU directly at every load: no host copy, at the link's limit,
  for a process that loads one archive onto GPUs more than once. The first
  load pays the locking (:attr:`Archive.registration_seconds`); later loads
  with ``"stage"`` read the locked mapping directly too.

Page-cache pages stay shared between processes either way
(``cudaHostRegisterReadOnly`` takes no private copy). Locking windows of the
mapping per load instead was measured and left out: slower than staging, and
it slowed the staging beside it (loader/device_pipeline.h).
"""
from __future__ import annotations

from typing import Tuple

import torch

from ._errors import Error, ErrorCode

PINS = ("stage", "register")
NO_LOCK = (0, 0)  # the C++ extension's (locked_base, locked_size) for none


def check_pin(pin) -> None:
    if pin not in PINS:
        raise ValueError(f"pin: expected one of {', '.join(repr(p) for p in PINS)}, found {pin!r}")


def locked_range(archive, pin: str, device: str) -> Tuple[int, int]:
    """The C++ extension's (locked_base, locked_size) for a copy to
    ``device`` (python/src/module.cc DirectArgs): the archive's locked
    mapping, locked here first with ``pin="register"`` (``pin`` checked by
    the caller, before anything else)."""
    if pin == "register":
        from . import _register
        if not torch.cuda.is_available() or torch.device(device).type != "cuda":
            raise Error(f"{archive.path}: pin=\"register\" needs a CUDA device, found "
                        f"{device!r}" + ("" if torch.cuda.is_available() else
                                         " (no CUDA device/driver is present)"),
                        ErrorCode.UNSUPPORTED, archive.path)
        _register.registration(archive)
    kept = getattr(archive, "_registration", None)
    return NO_LOCK if kept is None else (kept.base, kept.size)
