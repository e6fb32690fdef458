"""load_into on the portable path (tsar/_portable.py): the accelerator's
BindSlots (loader/bind_common.cc) in Python, with the same rules, reports and
messages: names matched under the prefixes, dtype and shape checked (a rank's
slice under tensor parallelism), ties bound through their twin, nothing left on
meta, nothing changed unless everything checks. Each matched tensor then takes
its archive view in place with ``tensor.data = view`` (the same Parameter
object; a meta tensor becomes a CPU one)."""
from __future__ import annotations

import torch

from ._errors import Error, ErrorCode
from ._portable import PortableArchive, _chunk, _chunk_size, _dtype, unsupported


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
    full, shard_dim = tuple(info[3]), info[9]
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
        if len(differing) == 1 and mine[differing[0]] == _chunk_size(full[differing[0]], rank, world):
            return differing[0], ""
    return None, (f"shape {_shape(mine)} vs archive {_shape(full)} (neither whole nor rank {rank}'s "
                  f"slice of {world} along one dim)")


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


def bind(archive: PortableArchive, items, training: bool, options, loose):
    """(bound, missing, unexpected, mismatched, tied), as ``_tsar.bind``."""
    (entry, strict, allow_training, archive_prefix, module_prefix, rank, world, device,
     read_ahead) = options
    path = archive.path
    if device:
        raise unsupported(path, f"load_into(device={device!r})")
    if read_ahead:
        raise unsupported(path, "load_into(read_ahead=True)")
    entry_name = archive._file.bind_entry(entry)
    if training and archive.mode == "shared" and not allow_training:
        raise _error(path, "bind: the module is in training mode, whose layers (BatchNorm running stats) "
                    "write their buffers, and this archive is mapped read-only: call module.eval() "
                    "before binding, or open the archive copy-on-write (C++ MapMode::kCopyOnWrite, "
                    "Python mode=\"copy_on_write\")", ErrorCode.INVALID_ARGUMENT)
    if world < 0:
        raise _error(path, f"bind: world: expected 0 or 1 (no tensor parallelism) or the number of ranks, "
                    f"found {world}. Nothing was changed", ErrorCode.INVALID_ARGUMENT)
    if world <= 1 and rank != 0:
        raise _error(path, f"bind: rank: expected 0 without tensor parallelism (world {world}), found "
                    f"{rank}; pass world= the number of ranks. Nothing was changed",
                    ErrorCode.INVALID_ARGUMENT)
    if world > 1 and not 0 <= rank < world:
        raise _error(path, f"bind: rank: expected 0 to {world - 1} for world {world}, found {rank}",
                    ErrorCode.INVALID_ARGUMENT)
    tp = world > 1 or archive.tp_world != 0
    infos, by_name = archive.table(entry_name)

    n = len(items)
    views = [None] * n  # what each matched slot takes
    state = ["missing"] * n
    why_of = []
    used = set()
    for i, (name, t) in enumerate(items):
        dev = t.device.type
        if dev not in ("cpu", "meta"):
            raise _error(path, f"bind: {_quote(name)} is on {t.device}: tsar binds modules on cpu or meta "
                        "(built with torch.device(\"meta\")); move the module to cpu or meta first. "
                        "Nothing was changed", ErrorCode.INVALID_ARGUMENT)
        if not name.startswith(module_prefix):
            continue
        info = by_name.get(archive_prefix + name[len(module_prefix):])
        if info is None:
            continue
        if t.layout != torch.strided:
            raise _error(path, f"bind: {_quote(name)} is a {t.layout} tensor: tsar binds strided (dense) "
                        "tensors, whose storage can be the archive's; make it dense first "
                        "(to_dense()). Nothing was changed", ErrorCode.INVALID_ARGUMENT)
        used.add(info[0])
        if info[1] is None:  # a sparse tensor of the archive
            raise unsupported(path, f"binding sparse tensor {info[0]!r}")
        why = []
        want = _dtype(info[2], path)
        if t.dtype != want:
            why.append(f"dtype {str(t.dtype)[6:]} vs archive {info[2]}")
        mine = tuple(t.shape)
        split = None
        if tp:
            split, w = _rank_shape(mine, info, rank, world)
            if w:
                why.append(w)
        elif mine != tuple(info[3]):
            why.append(f"shape {_shape(mine)} vs archive {_shape(info[3])}")
        if why:
            state[i] = "mismatched"
            why_of.append((i, ", ".join(why)))
            continue
        state[i] = "matched"
        view = archive.view(info)
        if split is not None:
            view = _chunk(view, world, split, rank)
        views[i] = view

    # Ties: one tensor object under several names.
    groups = {}
    for i, (_, t) in enumerate(items):
        groups.setdefault(id(t), []).append(i)
    bound = [False] * n
    for members in groups.values():
        first = None
        for i in members:
            if state[i] != "matched":
                continue
            if first is None:
                first = i
            elif views[i] is not views[first] and not _same_values(views[first], views[i]):
                state[i] = "mismatched"
                views[i] = None
                why_of.append((i, f"the same tensor as {_quote(items[first][0])} in the module, but "
                                  "the archive holds other values for it (tied in the module, not "
                                  "in the archive)"))
        for i in members:
            bound[i] = first is not None
            if bound[i] and state[i] == "missing":
                state[i] = "tied"

    missing = [items[i][0] for i in range(n) if state[i] == "missing"]
    tied = [items[i][0] for i in range(n) if state[i] == "tied"]
    mismatched = [items[i][0] + ": " + why for i, why in sorted(why_of)]
    unexpected = [i[0] for i in infos if i[0] not in used]
    if strict and (missing or unexpected or mismatched):
        msg = f"bind: module and entry {_quote(entry_name)} do not match:"
        if missing:
            msg += " missing in archive: " + _list(missing) + ";"
        if unexpected:
            msg += " not in module: " + _list(unexpected) + ";"
        if mismatched:
            msg += " mismatched: " + _list(mismatched) + ";"
        raise _error(path, msg[:-1], ErrorCode.BIND_MISMATCH)
    _check_nothing_stays_meta(items, state, bound, loose, path, entry_name)

    names = []
    done = set()  # ids of tensors already bound (a tie binds once)
    with torch.no_grad():
        for i, (name, t) in enumerate(items):
            view = views[i]
            if view is None:
                continue
            names.append(name)
            if id(t) in done:
                continue
            done.add(id(t))
            if t.is_meta:
                # set_data refuses to give a meta tensor CPU data: the object
                # takes the view's TensorImpl instead (its class, dict and
                # requires_grad kept), so it is still the module's object.
                torch.utils.swap_tensors(t, torch.Tensor._make_subclass(type(t), view, t.requires_grad))
            else:
                t.data = view
    return names, missing, unexpected, mismatched, tied


def _check_nothing_stays_meta(items, state, bound, loose, path, entry_name):
    unbound = [name + (" (mismatched)" if state[i] == "mismatched" else " (not in the archive)")
               for i, (name, t) in enumerate(items) if not bound[i] and t.is_meta]
    bound_ids = {id(items[i][1]) for i in range(len(items)) if bound[i]} if loose else set()
    buffers = [name for name, t in loose if t.is_meta and id(t) not in bound_ids]
    if not unbound and not buffers:
        return
    msg = ("bind: the module would keep tensors on the meta device, which the archive's entry "
           f"{_quote(entry_name)} does not bind: ")
    if buffers:
        msg += (_list(buffers) + " (non-persistent buffers, which no archive holds: state_dict() "
                "leaves them out, and they were made on meta with the module). Build the module "
                "under tsar.empty_parameters() (parameters on meta, buffers made for real) instead "
                "of torch.device(\"meta\"), or give these buffers their values before binding")
        if unbound:
            msg += "; "
    if unbound:
        msg += _list(unbound)
    raise _error(path, msg + ". A module on meta is bound completely or not at all. Nothing was "
                 "changed", ErrorCode.BIND_MISMATCH)
