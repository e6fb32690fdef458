"""load_into on the portable path (tsar/_portable.py): the accelerator's
BindSlots (loader/bind_common.cc) in Python, with the same rules, reports and
messages: names matched under the prefixes, dtype and shape checked (a rank's
slice under tensor parallelism), ties bound through their twin, nothing left on
meta, nothing changed unless everything checks. Each matched tensor then takes
its archive view in place with ``tensor.data = view`` (the same Parameter
object; a meta tensor takes a CPU tensor's TensorImpl). With ``device=`` the
views are of the matched storages' copies on that device, each storage copied
once through the staging pipeline (tsar/_portable_device.py)."""
from __future__ import annotations

import torch

from ._errors import Error, ErrorCode
from . import _tsar_portable
from ._module_state import PLAIN, plain, state_items
from ._portable import PortableArchive, _chunk, _chunk_size


def _facts(name):
    """torch's own getter of attribute ``name`` (torch._C.TensorBase's
    descriptor): a subclass's property of the same name never runs, so the
    bind reads what a tensor is, not what it says (a Parameter subclass whose
    ``shape`` claims [3, 4] over 12 elements is [12] here, as the accelerator
    reads its TensorImpl). :func:`bind` runs them with subclasses'
    __torch_function__ disabled, which could answer anything too."""
    return torch._C.TensorBase.__dict__[name].__get__


_is_cpu, _is_meta, _device_of, _layout_of, _dtype_of, _shape_of, _requires_grad_of = map(
    _facts, ("is_cpu", "is_meta", "device", "layout", "dtype", "shape", "requires_grad"))
_set_data = torch._C.TensorBase.__dict__["data"].__set__


def _error(path, message, code):
    """tsar.Error as the accelerator's: "PATH: message"."""
    return Error(f"{path}: {message}", code, path)


def _list(names, most=20):
    out = ", ".join(names[:most])
    return out + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def _shape(s):
    return "[" + ", ".join(str(x) for x in s) + "]"


def _quote(s):
    return '"' + s + '"'


def _rank_shape(mine, info, rank, world):
    """(None or the dim to split along, "" or why not): which part of the
    archive tensor ``info`` a rank's slot of shape ``mine`` takes."""
    full, shard_dim = info[2], info[7]
    if world <= 1:
        return None, "" if mine == full else f"shape {_shape(mine)} vs archive {_shape(full)}"
    if shard_dim >= 0:
        want = list(full)
        want[shard_dim] = _chunk_size(full[shard_dim], rank, world)
        if mine == tuple(want):
            return shard_dim, ""
        return None, (f"shape {_shape(mine)} vs {_shape(want)}, rank {rank}'s slice of archive "
                      f"{_shape(full)} packed sharded along dim {shard_dim}")
    if mine == full:
        return None, ""
    if len(mine) == len(full):
        differing = [k for k in range(len(full)) if mine[k] != full[k]]
        d = differing[0] if len(differing) == 1 else None
        if d is not None and mine[d] == _chunk_size(full[d], rank, world):
            return d, ""
    return None, (f"shape {_shape(mine)} vs archive {_shape(full)} (neither whole nor rank "
                  f"{rank}'s slice of {world} along one dim)")


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """One view of one storage, or equal bytes (as the accelerator's
    memcmp: NaNs with equal bits are equal, 0.0 and -0.0 are not)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset() and a.stride() == b.stride()):
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def bind_module(archive: PortableArchive, module, options):
    """load_into's bind of ``module``: (bound, missing, unexpected,
    mismatched, tied), as the accelerator's ``_tsar.bind_module``. The loop
    runs in C++ (``_tsar_portable.bind_fast``, python/src/portable_bind.h)
    where it can answer: every plain success. Anything it declines (a
    mismatch, strict with names left over, a rank of another world than the
    archive's, a module with its own state_dict()...) comes back None,
    nothing changed, and
    :func:`bind` below runs, with the rules' messages."""
    read_ahead = options[8]
    report = None
    if _fast(archive, options):
        report = _tsar_portable.bind_fast(archive._file, module, None, False, None,
                                             _fast_options(options),
                                             archive.bind_api(PLAIN, plain))
    if report is None:
        items, training, loose = state_items(module)
        report = bind_items(archive, items, training, options, loose)
    if read_ahead:
        _read_ahead(archive, module, report[0])
    return report


def _fast(archive: PortableArchive, options) -> bool:
    """Whether bind_fast may answer: the CPU, and a rank of the world the
    archive was packed for (its slices are blocks) or no ranks; other
    worlds, whole modules of such an archive, in _bind."""
    rank, world, device = options[5], options[6], options[7]
    return not device and (world <= 1 and rank == 0 or world == archive.tp_world)


def _fast_options(options):
    entry, strict, allow_training, archive_prefix, module_prefix, rank, world = options[:7]
    return (entry, archive_prefix, module_prefix, strict, allow_training, rank, world)


def bind_items(archive: PortableArchive, items, training: bool, options, loose):
    """The bind of ``items`` (a module's (name, tensor), as state_items
    gives them): in C++ where it answers, else :func:`bind`."""
    report = None
    if _fast(archive, options):
        report = _tsar_portable.bind_fast(archive._file, None, items, training, loose,
                                             _fast_options(options),
                                             archive.bind_api(PLAIN, plain))
    return report if report is not None else bind(archive, items, training, options, loose)


def _read_ahead(archive: PortableArchive, module, bound) -> None:
    """load_into(read_ahead=True): the bytes the bound tensors view, read
    ahead of their first touch by a thread of tsar's (loader/read_ahead.h)."""
    names = set(bound)
    ranges = []
    base = torch._C.TensorBase
    with torch._C.DisableTorchFunctionSubclass():  # what each tensor is (_facts)
        for name, t in state_items(module)[0]:
            if name in names and _layout_of(t) is torch.strided and base.numel(t) > 0:
                last = sum((n - 1) * s for n, s in zip(_shape_of(t), base.stride(t)))
                ranges.append((base.data_ptr(t), (last + 1) * base.element_size(t)))
    _tsar_portable.read_ahead(archive._file, ranges)


def bind(archive: PortableArchive, items, training: bool, options, loose):
    """(bound, missing, unexpected, mismatched, tied), as ``_tsar.bind``."""
    with torch._C.DisableTorchFunctionSubclass():
        return _bind(archive, items, training, options, loose)


def _bind(archive: PortableArchive, items, training: bool, options, loose):
    (entry, strict, allow_training, archive_prefix, module_prefix, rank, world, device,
     read_ahead, direct) = options
    path = archive.path
    if device:
        from ._portable_device import check_device
        check_device(path, torch.device(device))
    entry_name = archive._file.bind_entry(entry)
    if training and archive.mode == "shared" and not allow_training:
        raise _error(path, "bind: the module is in training mode and this archive is mapped "
                     "read-only: training writes the weights (an optimizer's step) and train() "
                     "layers write their buffers (BatchNorm's running stats), into pages of the "
                     "file. To serve, call module.eval() before binding; to train or fine-tune, "
                     "open the archive copy-on-write (C++ MapMode::kCopyOnWrite, Python "
                     "mode=\"copy_on_write\": writes stay private to the process)",
                     ErrorCode.INVALID_ARGUMENT)
    if world < 0:
        raise _error(path, "bind: world: expected 0 or 1 (no tensor parallelism) or the number of "
                     f"ranks, found {world}. Nothing was changed", ErrorCode.INVALID_ARGUMENT)
    if world <= 1 and rank != 0:
        raise _error(path, f"bind: rank: expected 0 without tensor parallelism (world {world}), "
                     f"found {rank}; pass world= the number of ranks. Nothing was changed",
                     ErrorCode.INVALID_ARGUMENT)
    if world > 1 and not 0 <= rank < world:
        raise _error(path, f"bind: rank: expected 0 to {world - 1} for world {world}, found {rank}",
                     ErrorCode.INVALID_ARGUMENT)
    tp = world > 1 or archive.tp_world != 0
    rows, by_name = archive.table(entry_name)
    get = by_name.get
    renamed = bool(module_prefix or archive_prefix)
    strided = torch.strided

    # The match: a row (or None) per slot, and why a matched one mismatches.
    # The loop does per tensor only what a check needs; the rest runs for the
    # few slots that are odd.
    n = len(items)
    match = [None] * n
    splits = {}  # slot -> the dim its rank's slice is cut along (tensor parallelism)
    why_of = []
    first_of = {}  # id(tensor) -> its first slot
    twins = []  # later slots of a tensor already seen (ties)
    used = set()  # archive names some slot asked for
    for i, (name, t) in enumerate(items):
        if first_of.setdefault(id(t), i) != i:
            twins.append(i)
        if not isinstance(t, torch.Tensor):
            raise _error(path, f"bind: {_quote(name)} is a {type(t).__name__}, not a tensor: tsar "
                         "binds tensors. Nothing was changed", ErrorCode.INVALID_ARGUMENT)
        if not (_is_cpu(t) or _is_meta(t)):
            raise _error(path, f"bind: {_quote(name)} is on {_device_of(t)}: tsar binds modules on "
                         "cpu or meta (built with torch.device(\"meta\")); move the module to cpu "
                         "or meta first. Nothing was changed", ErrorCode.INVALID_ARGUMENT)
        if renamed:
            if not name.startswith(module_prefix):
                continue
            row = get(archive_prefix + name[len(module_prefix):])
        else:
            row = get(name)
        if row is None or row[1] is None:  # a sparse tensor is no record to bind (as C++)
            continue
        used.add(row[0])
        layout, dtype, shape = _layout_of(t), _dtype_of(t), _shape_of(t)
        if layout is not strided:
            raise _error(path, f"bind: {_quote(name)} is a {layout} tensor: tsar binds strided "
                         "(dense) tensors, whose storage can be the archive's; make it dense first "
                         "(to_dense()). Nothing was changed", ErrorCode.INVALID_ARGUMENT)
        match[i] = row
        if tp:
            split, w = _rank_shape(tuple(shape), row, rank, world)
            if split is not None:
                splits[i] = split
            why = [w] if w else []
        elif shape == row[2] and dtype is row[1]:
            continue
        else:
            why = ([] if shape == row[2]
                   else [f"shape {_shape(shape)} vs archive {_shape(row[2])}"])
        if dtype is not row[1]:
            theirs = str(row[1]).replace("torch.", "")
            why.insert(0, f"dtype {str(dtype)[6:]} vs archive {theirs}")
        if why:
            match[i] = None
            why_of.append((i, ", ".join(why)))
    mismatched_slots = {i for i, _ in why_of}

    def view(i):
        if i in splits:  # a rank's own slice: its run of the file
            return archive.slice(match[i], entry_name, rank, world, splits[i])
        return archive.view(match[i])

    # Ties: one tensor object under several names (rare: checked only for them).
    bound = None  # per slot, whether its tensor is bound by some name; None: all matched are
    tied = []
    if twins:
        groups = {}
        for i in twins:
            groups.setdefault(first_of[id(items[i][1])], [first_of[id(items[i][1])]]).append(i)
        bound = [m is not None for m in match]
        for members in groups.values():
            first = None
            for i in members:
                if match[i] is None:
                    continue
                if first is None:
                    first = i
                elif match[i] is not match[first] and not _same_values(view(first), view(i)):
                    match[i] = None
                    mismatched_slots.add(i)
                    why_of.append((i, f"the same tensor as {_quote(items[first][0])} in the "
                                      "module, but the archive holds other values for it (tied "
                                      "in the module, not in the archive)"))
            for i in members:
                bound[i] = first is not None
                if bound[i] and match[i] is None and i not in mismatched_slots:
                    tied.append(i)
        tied.sort()
    tied_set = set(tied)
    missing = [items[i][0] for i in range(n)
               if match[i] is None and i not in mismatched_slots and i not in tied_set]
    tied = [items[i][0] for i in tied]
    mismatched = [items[i][0] + ": " + why for i, why in sorted(why_of)]
    unexpected = [r[0] for r in rows if r[0] not in used and r[1] is not None]
    if strict and (missing or unexpected or mismatched):
        raise _error(path, mismatch_message(entry_name, missing, unexpected, mismatched),
                     ErrorCode.BIND_MISMATCH)
    if bound is None:
        bound = [m is not None for m in match]
    _check_nothing_stays_meta(items, mismatched_slots, bound, loose, path, entry_name)

    # Every check passed. Onto a device: each matched storage copied there
    # once (tsar/_portable_device.py), the tensors views of the copies.
    bound_view = view
    if device:
        from ._portable_device import DeviceViews, STAGING
        copies = DeviceViews(archive, [m for m in match if m is not None], torch.device(device),
                             STAGING, direct)

        def bound_view(i):
            v = copies.view(match[i])
            return _chunk(v, world, splits[i], rank) if i in splits else v

    # Each matched tensor takes its view, in place.
    names = []
    done = set()  # ids of tensors already bound (a tie binds once)
    swap = torch._C._swap_tensor_impl
    make_subclass = torch.Tensor._make_subclass
    with torch.no_grad():
        for i in range(n):
            if match[i] is None:
                continue
            name, t = items[i]
            names.append(name)
            if twins:
                if id(t) in done:
                    continue
                done.add(id(t))
            if _is_meta(t):
                # set_data refuses CPU data for a meta tensor: the object takes
                # the TensorImpl of a CPU tensor of its own class and
                # requires_grad instead, keeping its __dict__, so it is still
                # the module's object (torch.utils.swap_tensors, without moving
                # the attributes).
                swap(t, make_subclass(type(t), bound_view(i), _requires_grad_of(t)))
            else:
                _set_data(t, bound_view(i))
    return names, missing, unexpected, mismatched, tied


def mismatch_message(entry_name, missing, unexpected, mismatched) -> str:
    """A strict bind's refusal, as the accelerator's (loader/bind_common.cc)."""
    msg = f"bind: module and entry {_quote(entry_name)} do not match:"
    if missing:
        msg += " missing in archive: " + _list(missing) + ";"
    if unexpected:
        msg += " not in module: " + _list(unexpected) + ";"
    if mismatched:
        msg += " mismatched: " + _list(mismatched) + ";"
    return msg[:-1]


def _check_nothing_stays_meta(items, mismatched, bound, loose, path, entry_name):
    unbound = [name + (" (mismatched)" if i in mismatched else " (not in the archive)")
               for i, (name, t) in enumerate(items) if not bound[i] and _is_meta(t)]
    bound_ids = {id(items[i][1]) for i in range(len(items)) if bound[i]} if loose else set()
    buffers = [name for name, t in loose if _is_meta(t) and id(t) not in bound_ids]
    if not unbound and not buffers:
        return
    msg = ("bind: the module would keep tensors on the meta device, which the archive's entry "
           f"{_quote(entry_name)} does not bind: ")
    if buffers:
        msg += (_list(buffers) + " (non-persistent buffers: state_dict() leaves them out, so a "
                "bind never takes them from an archive, even one that holds a tensor of that name, "
                "and they were made on meta with the module). Build the module "
                "under tsar.empty_parameters() (parameters on meta, buffers made for real) instead "
                "of torch.device(\"meta\"), or give these buffers their values before binding")
        if unbound:
            msg += "; "
    if unbound:
        msg += _list(unbound)
    raise _error(path, msg + ". A module on meta is bound completely or not at all. Nothing was "
                 "changed", ErrorCode.BIND_MISMATCH)
