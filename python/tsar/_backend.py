"""Which of tsar's two paths this process runs.

- The accelerator, ``tsar._tsar`` (python/src/module.cc): tsar's C++ loader
  linked against the LibTorch of one torch build, the one tsar was built
  beside. Binds 268 tensors in about 0.4 ms; loads onto GPUs; writes archives.
- The portable path, ``tsar._tsar_portable`` + tsar/_portable.py: links no
  LibTorch and works with any torch of the supported range: everything the
  accelerator does, binding at about half its speed (docs/python.md).

The accelerator is used when the torch imported is exactly the one it was
built against and it imports; otherwise the portable path, silently (see
:func:`tsar.backend`). TSAR_PORTABLE=1 in the environment chooses the portable
path whatever the torch.
"""
from __future__ import annotations

import os

import torch

from ._build_info import torch_version as built_against

accelerator = None  # tsar._tsar, when it serves this torch
why_portable = ""  # why not, when it does not

if os.environ.get("TSAR_PORTABLE", "") not in ("", "0"):
    why_portable = "TSAR_PORTABLE is set"
elif not built_against:
    why_portable = "this tsar was built without its accelerator"
elif torch.__version__ != built_against:
    # It links that torch's LibTorch by name: against another build it would
    # fail with undefined symbols, or worse, run with a different ABI.
    why_portable = f"its accelerator was built for torch {built_against}"
else:
    try:
        from . import _tsar as accelerator
    except ImportError as e:  # a damaged install, a missing library
        why_portable = f"its accelerator does not import: {e}"


def describe() -> str:
    if accelerator is not None:
        return f"accelerator (tsar._tsar, built for torch {built_against})"
    return f"portable (torch {torch.__version__}: {why_portable})"
