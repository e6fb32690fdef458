"""The format's dtypes as this torch's (the portable path's table, shared by
tsar/_portable.py and tsar/_portable_device.py), and a storage's bytes as
whole elements of one."""
from __future__ import annotations

from typing import Dict

import torch

from . import _tsar_portable
from ._errors import Error, ErrorCode

# The format's dtypes this torch has, by name (the format's names are torch's:
# "bfloat16", "float8_e4m3fn"): what entry_table puts in each row.
DTYPES: Dict[str, torch.dtype] = {
    n: getattr(torch, n) for n in _tsar_portable.dtype_names()
    if isinstance(getattr(torch, n, None), torch.dtype)}


def torch_dtype(name: str, path: str) -> torch.dtype:
    """torch's dtype named ``name``; UNSUPPORTED where this torch lacks it."""
    d = DTYPES.get(name)
    if d is None:
        raise Error(f"{path}: dtype {name} is not supported by this torch ({torch.__version__})",
                    ErrorCode.UNSUPPORTED, path)
    return d


def as_dtype(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The whole elements of ``dtype`` in the 1-d uint8 tensor ``raw``, as a
    1-d view of the same storage (bytes past the last whole one left out)."""
    item = dtype.itemsize
    whole = raw.numel() - raw.numel() % item
    return (raw[:whole] if whole != raw.numel() else raw).view(dtype)
