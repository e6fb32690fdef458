"""Tensor groups (spec §4.13, format 1.5) as tsar.Archive gives them and
load_into binds them: a torchao quantized weight, stored as its inner tensors
plus a description, becomes its class again here, on both paths.

Both extensions list an entry's groups (``groups(entry)``: name, member
names, outer sizes, strides, dtype, description) and give a group's members
under their own names in ``state_dict`` (C++ has no torchao). This module puts
the rebuilt tensor in their place (tsar/_torchao.py: only through its table)
and binds groups into a module as ``load_state_dict(assign=True)`` would: the
module's parameter becomes a Parameter of the stored class, whether or not the
module was quantized first, its inner tensors views of the mapping.
"""
from __future__ import annotations

import collections
from typing import Dict, List, NamedTuple, Tuple

import torch

from ._errors import Error, ErrorCode


class GroupRow(NamedTuple):
    name: str
    members: List[str]  # the member tensors' names in the archive ("w.qdata")
    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]
    dtype: torch.dtype
    description: str


def groups(impl, entry: str) -> List[GroupRow]:
    """The groups of ``entry`` as either extension's archive (``impl``)
    lists them (tsar.Archive._groups_of asks, once per entry)."""
    rows = []
    for name, members, sizes, strides, dtype, description in impl.groups(entry):
        if not isinstance(dtype, torch.dtype):  # the portable extension names it
            from ._portable_dtypes import torch_dtype
            dtype = torch_dtype(dtype, impl.path)
        rows.append(GroupRow(name, list(members), tuple(sizes), tuple(strides), dtype,
                             description))
    return rows


def rebuild(path: str, g: GroupRow, tensors: Dict[str, torch.Tensor]) -> torch.Tensor:
    """The tensor of group ``g`` over its members' tensors (``tensors``:
    archive name -> tensor, used as they are: views of the mapping stay
    views). tsar.Error naming the archive and the group otherwise."""
    from . import _torchao

    try:
        return _torchao.rebuild_described(g.name, g.description, [tensors[m] for m in g.members],
                                          g.sizes, g.strides, g.dtype)
    except Error as e:
        raise Error(f"{path}: {e}", e.code, path) from None


def with_groups(path: str, items, rows: List[GroupRow]) -> "collections.OrderedDict":
    """``items`` ((name, tensor) in file order, each group's members under
    their own names) with each group rebuilt in the place of its first member."""
    first = {g.members[0]: g for g in rows}
    members = {m for g in rows for m in g.members}
    items = list(items)
    by_name = dict(items)
    out = collections.OrderedDict()
    for name, t in items:
        if name not in members:
            out[name] = t
        elif name in first:
            g = first[name]
            out[g.name] = rebuild(path, g, by_name)
    return out


def find(rows: List[GroupRow], name: str):
    return next((g for g in rows if g.name == name), None)


# -- load_into ---------------------------------------------------------------------


def _owner(module: torch.nn.Module, name: str):
    """(submodule, attribute) that module name ``name`` (one state_items
    listed, so each step is a child) is: through the _modules dicts, as
    state_dict() walks them (get_submodule costs 10 us a name)."""
    *path, attr = name.split(".")
    m = module
    for part in path:
        m = m._modules[part]
    return m, attr


class Plan(NamedTuple):
    """What load_into does with an archive's groups, decided before anything
    changes: the module names they bind, and what does not match."""
    assign: List[Tuple[str, GroupRow]]  # (module name, group)
    unexpected: List[str]
    mismatched: List[str]  # "name: why", as BindReport.mismatched
    left_on_meta: List[str]  # the mismatched module names whose tensor is on meta


def plan(module: torch.nn.Module, rows: List[GroupRow], items, archive_prefix: str,
         module_prefix: str) -> Plan:
    """Matches each group to the module's slot of the same name (as
    load_into names them: ``items`` are the module's (name, tensor)), its
    outer shape against the slot's."""
    slots = dict(items)
    assign, unexpected, mismatched, meta = [], [], [], []
    for g in rows:
        if not g.name.startswith(archive_prefix):
            unexpected.append(g.name)
            continue
        name = module_prefix + g.name[len(archive_prefix):]
        slot = slots.get(name)
        if slot is None:
            unexpected.append(g.name)
        elif tuple(slot.shape) != g.sizes:
            mismatched.append(f"{name}: shape {list(slot.shape)} vs archive {list(g.sizes)} "
                              f"(a quantized {g.name!r})")
            if slot.is_meta:
                meta.append(name)
        else:
            assign.append((name, g))
    return Plan(assign, unexpected, mismatched, meta)


def make(archive, entry: str, p: Plan, device: str) -> List[Tuple[str, torch.Tensor]]:
    """(module name, rebuilt tensor) of each planned group: made before
    anything changes, so that a group torchao refuses leaves the module as
    it was. On a ``device``, its members are copied there first."""
    made = []
    impl = archive._a()
    for name, g in p.assign:
        tensors = {m: impl.tensor(m, entry) for m in g.members}
        if device:
            tensors = {m: t.to(device) for m, t in tensors.items()}
        made.append((name, rebuild(archive.path, g, tensors)))
    return made


def put(module: torch.nn.Module, made: List[Tuple[str, torch.Tensor]]) -> List[str]:
    """Puts each made tensor in its slot, as ``load_state_dict(assign=True)``
    would: a parameter becomes a Parameter of the group's class
    (requires_grad False: quantized weights are not trained), a buffer the
    tensor itself. Returns the module names bound."""
    # The tensors' own requires_grad and attributes, not through torchao's
    # __torch_function__ (1.5 us a tensor).
    with torch._C.DisableTorchFunctionSubclass():
        for name, t in made:
            owner, attr = _owner(module, name)
            if attr in owner._parameters:
                # What Parameter(t, requires_grad=False) makes of a tensor
                # subclass, less its detach(): t is new, no one else holds it.
                if t.requires_grad:
                    t.requires_grad_(False)
                t._is_param = True
                owner._parameters[attr] = t
            else:
                owner._buffers[attr] = t
    return [name for name, _ in made]


def refuse(path: str, entry: str, p: Plan) -> Error:
    """BIND_MISMATCH for groups that do not match under strict=True."""
    parts = []
    if p.unexpected:
        parts.append("not in module: " + ", ".join(p.unexpected))
    if p.mismatched:
        parts.append("mismatched: " + "; ".join(p.mismatched))
    why = (f" ({', '.join(p.left_on_meta)} would stay on the meta device: a module on meta is "
           "bound completely or not at all)" if p.left_on_meta else "")
    return Error(f"{path}: bind of entry {entry!r}: the archive's quantized tensors do not match "
                 f"the module: {'; '.join(parts)}{why}. Nothing was changed",
                 ErrorCode.BIND_MISMATCH, path)
