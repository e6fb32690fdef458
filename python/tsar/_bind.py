"""tsar.load_into (rebind a module in place, zero copy) and tsar.load."""
from __future__ import annotations

import gc
import os
from typing import Dict, List, NamedTuple, Optional, Union

import torch

from . import _tsar
from ._archive import Archive, open as _open


_Module = torch.nn.Module
_PLAIN = {}  # type -> whether state_dict of its instances is Module's own walk


def _plain(cls) -> bool:
    """True when ``cls`` keeps nn.Module's state_dict: no override of
    state_dict, _save_to_state_dict or get_extra_state."""
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = (cls.state_dict is _Module.state_dict
                 and cls._save_to_state_dict is _Module._save_to_state_dict
                 and cls.get_extra_state is _Module.get_extra_state)
        _PLAIN[cls] = plain
    return plain


def _state_items(module):
    """``list(module.state_dict(keep_vars=True).items())`` and whether any
    submodule is training, in one walk of the module tree. state_dict()
    itself costs 2.4 us and modules() 0.8 us a module in Python (0.43 s for a
    mixture of experts of 133,000 modules); this walk reads the same dicts in
    the same order. Modules with state_dict hooks or their own state_dict
    logic are left to state_dict(). load_into first tries the same walk in
    C++ (``_tsar.bind_module``, python/src/module_walk.cc), which declines
    (None) exactly where this one calls state_dict()."""
    items, training = [], False
    stack = [("", module)]
    while stack:
        prefix, m = stack.pop()
        if (m._state_dict_hooks or m._state_dict_pre_hooks or not _plain(type(m))):
            return list(module.state_dict(keep_vars=True).items()), any(x.training for x in module.modules())
        training = training or m.training
        for name, p in m._parameters.items():
            if p is not None:
                items.append((prefix + name, p))
        skip = m._non_persistent_buffers_set
        for name, b in m._buffers.items():
            if b is not None and name not in skip:
                items.append((prefix + name, b))
        children = [(prefix + name + ".", c) for name, c in m._modules.items() if c is not None]
        stack.extend(reversed(children))
    return items, training


class BindReport(NamedTuple):
    bound: List[str]  # names now pointing into the archive
    missing: List[str]  # in the module, not in the archive
    unexpected: List[str]  # in the archive, not in the module
    mismatched: List[str]  # "name: shape [2, 3] vs archive [3, 2]", dtype likewise


def load_into(
    module: torch.nn.Module,
    path_or_archive: Union[str, os.PathLike, Archive],
    *,
    entry: Optional[str] = None,
    strict: bool = True,
    allow_training: bool = False,
    archive_prefix: str = "",
    module_prefix: str = "",
    rank: int = 0,
    world: int = 0,
    device=None,
    read_ahead: bool = False,
) -> BindReport:
    """Points every parameter and buffer of ``module`` at the archive, in place.

    No copy: afterwards each parameter is the same ``Parameter`` object as
    before (optimizers and hooks holding it stay valid), with its data inside
    the archive's mapping; tied parameters are still one object;
    ``requires_grad`` is kept. Names are those of ``module.state_dict()``.
    ``entry`` defaults to the only entry; with several (a checkpoint) to the one
    named ``"model"``, else the only one holding parameters or buffers, else
    tsar.Error (NOT_FOUND) lists them and asks for ``entry=``.

    strict=True: any name missing from the archive, not in the module, or with
    another shape or dtype raises one :class:`tsar.Error` (BIND_MISMATCH)
    listing them all, and the module is left unchanged. strict=False binds what
    matches and reports the rest.

    Over a ``mode="shared"`` archive the weights are read-only memory: a module
    with any submodule in training mode (BatchNorm writes its running stats)
    raises tsar.Error (INVALID_ARGUMENT). Call ``module.eval()`` first, open the
    archive with ``mode="copy_on_write"``, or pass ``allow_training=True`` if you
    know nothing writes.

    Names that differ by a prefix: ``archive_prefix="module."`` binds an
    archive of a DDP model (``module.fc.weight``) into the plain model;
    ``module_prefix="model."`` binds a plain archive into a module that wraps
    the model as ``self.model``. A module name ``M`` then matches the archive
    name ``archive_prefix + (M without module_prefix)``; module names without
    ``module_prefix`` are missing (``BindOptions`` in C++).

    Devices: a module on the CPU, or built on the meta device (``with
    torch.device("meta"): model = Model()``, or ``model.to("meta")``), or partly
    both. A meta tensor becomes a CPU tensor inside the mapping in place: the
    same ``Parameter`` object, as for a CPU tensor, so no weight memory is ever
    allocated. A meta tensor the archive does not bind is refused (BIND_MISMATCH)
    even with strict=False, and a tensor on any other device (CUDA...) is
    refused (INVALID_ARGUMENT) naming it; either way nothing is changed.

    Tensor parallelism: with ``world`` > 1, ``module`` is rank ``rank``'s of
    ``world`` (built with its slice shapes). A parameter whose shape is the
    archive tensor's split ``world`` ways along one dimension is bound to
    ``torch.chunk(full, world, dim)[rank]`` (:meth:`Archive.shard`), one with
    the whole shape to the whole tensor, any other shape is a mismatch naming
    both. In an archive saved for ``world`` ranks (``tsar.save(..., tp=world,
    shard=...)``, ``tsar pack --tp``) each slice is one contiguous run of the
    file and the rank touches only its runs and the replicated tensors; from
    an archive without a plan a slice along a later dimension is a strided
    view that touches every page of the tensor.

    ``device`` ("cuda:0"...): the weights go to that GPU instead. The match
    and every check are the CPU bind's (meta modules, ranks, prefixes); then
    each storage the module binds is copied once to the GPU (C++ ``bind``
    with ``BindOptions::device``: the staging pipeline of
    :meth:`Archive.state_dict` with ``device=``) and the module's own tensors
    become views of the device copies, as ``module.to()`` does it: the same
    ``Parameter`` objects, tied parameters still one object, views still
    views. Tensors the archive does not hold (non-persistent buffers such as
    rotary frequencies, names left unmatched with ``strict=False``) then go
    to the device too, by torch's own copy, so the whole module is there.
    Raises tsar.Error (UNSUPPORTED) before anything changes where torch has
    no CUDA or there is no GPU.

    ``read_ahead=True`` (CPU, mapped archive): once bound, a thread of tsar's
    own reads the bytes the module's tensors view into the page cache and this
    process's page tables, in file order, and load_into returns at once (a
    rank reads only its slices). For a server that binds at start and serves
    later: its first request then touches no disk and takes no page fault.
    Skipped when those bytes exceed half of the memory available. Off by
    default: where the first forward follows at once, the kernel's read-ahead
    of its first touches reads as fast.

    Returns a :class:`BindReport`. Not thread-safe for one module.
    """
    archive = path_or_archive if isinstance(path_or_archive, Archive) else _open(path_or_archive)
    target = "" if device is None or torch.device(device).type == "cpu" else str(torch.device(device))
    # The walk and the report make one tuple per tensor and no reference
    # cycle; left on, the collector promotes them and runs full collections
    # over the whole heap (a second model awaiting collection made binding
    # 100,000 tensors 5x slower).
    collecting = gc.isenabled()
    gc.disable()
    try:
        options = (entry or "", bool(strict), bool(allow_training), str(archive_prefix),
                   str(module_prefix), int(rank), int(world), target, bool(read_ahead))
        # The module tree walked in C++; None for a module that needs its own
        # state_dict() (hooks, an overridden _save_to_state_dict...).
        report = _tsar.bind_module(archive._a(), module, _PLAIN, _plain, options)
        if report is None:
            items, training = _state_items(module)
            report = _tsar.bind(archive._a(), items, training, options)
            del items
        bound, missing, unexpected, mismatched = report
        if target:
            _rest_to(module, torch.device(target))
        return BindReport(bound, missing, unexpected, mismatched)
    finally:
        if collecting:
            gc.enable()


def _rest_to(module: torch.nn.Module, device: torch.device) -> None:
    """Moves, in place, the module's tensors still on the CPU (what the
    archive did not hold) to ``device``."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.device.type == "cpu":
                t.data = t.data.to(device)


def load(path: Union[str, os.PathLike], entry: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """``{name: tensor}`` of ``entry`` (default: the first), zero-copy over a
    shared read-only mapping (see :class:`tsar.Archive` about in-place writes).
    The shape of ``safetensors.torch.load_file``."""
    return dict(_open(path).state_dict(entry))


def install_fault_handler() -> None:
    """Installs a SIGSEGV/SIGBUS handler: a write into a read-only archive then
    prints ``tsar: write to read-only archive <path>: storage #i used by tensor
    "<name>"...`` before the process dies. Chains to any previous handler
    (Python's faulthandler included) for other faults."""
    _tsar.install_fault_handler()
