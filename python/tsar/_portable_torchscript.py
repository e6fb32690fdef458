"""TorchScript on the portable path, through this process's own torch
(torch.jit) instead of LibTorch's C++ API: what tsar.pack reads of a
TorchScript input, and the architecture file its arch= writes. The pack's C++
core (tsar._tsar_pack_portable) calls these from its readers
(python/src/portable_torchscript.h), so the rest of the pack (options,
layout, checksums, publishing both files together) is the accelerator's.

The tensors come in writer/torchscript.cc's order (per module its
parameters, its buffers, then its children; a tie under each of its names)
and the architecture is writer/architecture.cc's (every weight a stride-0
view of one zero, saved to a stream), so the same torch gives the same bytes
on either path. torch.jit's deprecation warnings are not shown: the caller
asked tsar, not torch.jit, and the accelerator's LibTorch gives none."""
from __future__ import annotations

import contextlib
import io
import warnings

import torch

from ._errors import Error, ErrorCode
from ._portable_save import Tensors

_ROLE_PARAMETER, _ROLE_BUFFER = 1, 2  # format::Role


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _load(path: str, what: str):
    try:
        with _quiet():
            return torch.jit.load(path, map_location="cpu")
    except Exception as e:  # torch raises RuntimeError, ValueError...
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise Error(f"{path}: {what}not a loadable TorchScript archive: {first}",
                    ErrorCode.BAD_INPUT, path) from None


def tensors(path: str):
    """(items, keep): the module's parameters and buffers as
    python/src/portable_refs.h reads them, and what owns their bytes."""
    module = _load(path, "")
    out = Tensors(path)
    items = []

    def walk(m, prefix):
        for name, p in m.named_parameters(recurse=False, remove_duplicate=False):
            items.append(out.item(prefix + name, p, _ROLE_PARAMETER))
        for name, b in m.named_buffers(recurse=False, remove_duplicate=False):
            items.append(out.item(prefix + name, b, _ROLE_BUFFER))
        for name, child in m.named_children():
            walk(child, prefix + name + ".")

    walk(module, "")
    return items, (out.keep, module)


def _strip(module) -> None:
    """Each parameter and buffer of ``module`` (every submodule's, any dtype)
    a stride-0 view of one zero of its dtype, its sizes kept, in place (so
    every reference to it sees the same object)."""
    done = set()
    with torch.no_grad():  # set_ on a leaf that requires grad
        for _, t in [*module.named_parameters(remove_duplicate=False),
                     *module.named_buffers(remove_duplicate=False)]:
            if t._cdata in done:
                continue
            done.add(t._cdata)
            if t.numel() > 1:  # one element or none: nothing to save
                zero = torch.zeros(1, dtype=t.dtype, device=t.device)
                t.set_(zero.untyped_storage(), 0, t.shape, (0,) * t.dim())


def architecture(path: str) -> bytes:
    """The module at ``path`` without its weights (as writer/architecture.cc
    writes it), saved to a stream, whose records are always named "archive/"."""
    module = _load(path, "--arch: ")
    _strip(module)
    buffer = io.BytesIO()
    with _quiet():
        torch.jit.save(module, buffer)
    # torch.jit.save memoizes every object something else still references,
    # and Python's objects do: the tensors _strip touched, and every
    # submodule, which torch.jit.load wraps in Python. So the stripped bytes
    # are loaded once more by the C++ loader alone (what torch.jit.load calls
    # before it wraps the module) and saved by it, with no Python object
    # over them, as writer/architecture.cc's LibTorch saves its module.
    plain = torch._C.import_ir_module_from_buffer(
        torch._C.CompilationUnit(), buffer.getvalue(), torch.device("cpu"), {}, False)
    return plain.save_to_buffer({})
