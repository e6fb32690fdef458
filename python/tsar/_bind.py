"""tsar.load_into (rebind a module in place, zero copy) and tsar.load."""
from __future__ import annotations

import gc
import os
from typing import Dict, List, NamedTuple, Optional, Union

import torch

from . import _backend
from ._archive import Archive, open as _open
from ._errors import Error, ErrorCode
from ._module_state import PLAIN, invalid as _invalid, plain, state_items


def _names(names: List[str], most: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return f"[{shown}, ... {len(names) - most} more]" if len(names) > most else f"[{shown}]"


class BindReport(NamedTuple):
    bound: List[str]  # names now pointing into the archive
    missing: List[str]  # in the module, not in the archive
    unexpected: List[str]  # in the archive, not in the module
    mismatched: List[str]  # "name: shape [2, 3] vs archive [3, 2]", dtype likewise
    # Names the archive lacks whose tensor is the same object as one bound by
    # another name (a tied lm_head.weight that save_pretrained stored once):
    # bound through that tie, in strict mode too.
    tied: List[str] = []

    def __repr__(self) -> str:  # a count of the bound names, not a page of them
        return (f"BindReport(bound={len(self.bound)} tensors, tied={_names(self.tied)}, "
                f"missing={_names(self.missing)}, unexpected={_names(self.unexpected)}, "
                f"mismatched={_names(self.mismatched)})")


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
    pin: str = "stage",
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
    matches and reports the rest. Ties: a name the archive lacks whose tensor
    is the same object as one bound by another name (``lm_head.weight`` tied
    to the embedding, which ``save_pretrained`` stores once) is bound through
    the tie, strict or not, and listed in ``BindReport.tied``; one tensor
    under two names the archive holds with different values is a mismatch.
    A module's extra state (what its ``get_extra_state()`` puts in
    state_dict(), not a tensor) is not weights: no archive holds it, and
    load_into leaves it alone, strict or not.

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

    Devices: a module on the CPU, or with its parameters on the meta device,
    or partly both. Build it under :func:`tsar.empty_parameters` (parameters
    on meta, buffers made for real): a meta tensor becomes a CPU tensor inside
    the mapping in place, the same ``Parameter`` object, so no weight memory is
    ever allocated. Nothing is ever left on meta silently: a meta tensor the
    archive does not bind (through its name or a tie), and a non-persistent
    buffer on meta (which no archive holds: ``with torch.device("meta")``
    makes BERT's ``position_ids`` and LLaMA's rotary ``inv_freq`` there), is
    refused (BIND_MISMATCH) even with strict=False, naming each; a tensor on
    any other device (CUDA...) is refused (INVALID_ARGUMENT) naming it; either
    way nothing is changed.

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
    ``pin="register"``, as for :meth:`Archive.state_dict`: the archive's
    mapping page-locked once and kept while ``path_or_archive`` (an open
    :class:`Archive`) lives, and read by the GPU directly, no host copy: for
    loading one archive onto GPUs again and again (replicas, hot swap).
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
    _check_rank_world(rank, world)
    target = _device(device)
    from . import _device as device_pin
    device_pin.check_pin(pin)
    archive = path_or_archive if isinstance(path_or_archive, Archive) else _open(path_or_archive)
    direct = device_pin.locked_range(archive, pin, target) if target else device_pin.NO_LOCK
    # The walk and the report make one tuple per tensor and no reference
    # cycle; left on, the collector promotes them and runs full collections
    # over the whole heap (a second model awaiting collection made binding
    # 100,000 tensors 5x slower).
    collecting = gc.isenabled()
    gc.disable()
    try:
        options = (entry or "", bool(strict), bool(allow_training), str(archive_prefix),
                   str(module_prefix), int(rank), int(world), target, bool(read_ahead), direct)
        # The module tree walked in C++; None for a module that needs its own
        # state_dict() (hooks, an overridden _save_to_state_dict...).
        accelerator = _backend.accelerator
        try:
            bind_entry, rows = _group_rows(archive, entry)
            if rows:
                report = _bind_groups(module, archive, bind_entry, rows, options)
            elif accelerator is not None:
                report = accelerator.bind_module(archive._a(), module, PLAIN, plain, options)
                if report is None:
                    items, training, loose = state_items(module)
                    report = accelerator.bind(archive._a(), items, training, options, loose)
                    del items, loose
            else:
                from . import _portable_bind
                report = _portable_bind.bind_module(archive._a(), module, options)
        except Error as e:
            if e.code == ErrorCode.BIND_MISMATCH and " not in module: " in str(e):
                raise _non_persistent_named(e, module, archive_prefix, module_prefix) from None
            raise
        bound, missing, unexpected, mismatched, tied = report
        if target:
            _rest_to(module, torch.device(target))
        elif bound and archive.mode == "shared":
            # A write into these tensors (training after a read-only bind)
            # then dies naming the archive, the tensor and the way out, not
            # with a bare SIGSEGV.
            install_fault_handler()
        return BindReport(bound, missing, unexpected, mismatched, tied)
    finally:
        if collecting:
            gc.enable()


def _group_rows(archive: Archive, entry: Optional[str]):
    """(the entry load_into binds, its tensor groups: quantized weights,
    format 1.5), or ("", ()) for every archive before 1.5."""
    if archive._a().format_version[1] < 5:
        return "", ()
    bind_entry = archive._a().bind_entry(entry or "")
    return bind_entry, archive._groups_of(bind_entry)


def _bind_groups(module, archive: Archive, bind_entry: str, rows, options):
    """load_into of an archive that holds tensor groups: the groups are
    matched and rebuilt in Python (tsar/_groups.py), every other tensor is
    bound by the path's own bind, then the groups take their slots. A
    mismatch under strict, on either side, changes nothing."""
    from . import _groups

    (_entry, strict, _allow_training, archive_prefix, module_prefix, rank, world, target,
     _read_ahead, _direct) = options
    items, training, loose = state_items(module)
    p = _groups.plan(module, rows, items, archive_prefix, module_prefix)
    if p.assign and world > 1:
        raise _invalid(f"{archive.path}: rank {rank} of {world}: the archive holds quantized "
                       f"tensors ({p.assign[0][1].name!r}...), which a tensor-parallel bind does "
                       "not slice yet; bind the whole model (world=0)")
    if strict and (p.unexpected or p.mismatched) or p.left_on_meta:
        raise _groups.refuse(archive.path, bind_entry, p)
    made = _groups.make(archive, bind_entry, p, target)
    taken = {name for name, _ in p.assign}
    items = [(n, t) for n, t in items if n not in taken]
    loose = [(n, t) for n, t in loose if n not in taken]
    if _backend.accelerator is not None:
        report = _backend.accelerator.bind(archive._a(), items, training, options, loose)
    else:
        from . import _portable_bind
        report = _portable_bind.bind_items(archive._a(), items, training, options, loose)
    bound, missing, unexpected, mismatched, tied = report
    return (bound + _groups.put(module, made), missing, unexpected + p.unexpected,
            mismatched + p.mismatched, tied)


def _non_persistent_named(e: Error, module, archive_prefix: str, module_prefix: str) -> Error:
    """``e`` (BIND_MISMATCH), saying which of the names "not in module" the
    module does hold, as non-persistent buffers: state_dict() leaves those
    out (BERT's ``embeddings.position_ids``, which older checkpoints hold),
    so they are not bound, and "not in module" alone would send the reader
    looking for a tensor the module has."""
    message = str(e)
    listed = message[message.index(" not in module: ") + len(" not in module: "):].split(";")[0]
    listed = set(listed.split(", "))
    held = []
    for prefix, m in module.named_modules():
        for name in m._non_persistent_buffers_set:
            if m._buffers.get(name) is None:
                continue
            full = f"{prefix}.{name}" if prefix else name
            stored = archive_prefix + full[len(module_prefix):]
            if full.startswith(module_prefix) and stored in listed:
                held.append(stored)
    if not held:
        return e
    return Error(f"{message}. Of these, the module holds {', '.join(sorted(held))} as "
                 "non-persistent buffers, which its constructor computes and state_dict() leaves "
                 "out, so a bind never takes them from an archive: pass strict=False (the rest is "
                 "still checked and bound), or leave them out of the archive",
                 e.code, e.path, e.offset)


_INT64_MAX = 2**63 - 1


def _check_rank_world(rank, world) -> None:
    """rank and world checked as load_into takes them (the C++ bind checks
    them against each other): ints of int64 range."""
    for name, v in (("rank", rank), ("world", world)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _invalid(f"{name}: expected an int, found {type(v).__name__} {v!r}")
        if not -_INT64_MAX <= v <= _INT64_MAX:
            raise _invalid(f"{name}: expected an int64, found {v}")


def _device(device) -> str:
    """"" for the CPU (or None), else the canonical device string; tsar.Error
    (INVALID_ARGUMENT) naming ``device=`` for what torch cannot parse or a
    negative index."""
    if device is None:
        return ""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise _invalid(f"device: expected None, \"cpu\" or a CUDA device such as \"cuda:0\", "
                       f"found {device!r} ({e})") from None
    if d.index is not None and d.index < 0:
        raise _invalid(f"device: expected a device index of 0 or more, found {device!r}")
    return "" if d.type == "cpu" else str(d)


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
    prints ``tsar: write to read-only archive <path> at file offset <n>:
    storage #i, tensor "<name>". ...`` with the way out (open the archive
    ``mode="copy_on_write"``) before the process dies. Chains to the handler
    installed before it (Python's faulthandler included) for every fault, so
    that one still reports and the process dies as it would have.
    :func:`load_into` calls it on its first read-only bind on the CPU; calling
    it again does nothing."""
    if _backend.accelerator is not None:  # it knows the mappings of the path that made them
        _backend.accelerator.install_fault_handler()
    else:
        from . import _tsar_portable

        _tsar_portable.install_fault_handler()
