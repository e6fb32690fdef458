"""tsar.transformers.load_model's bind: tsar.load_into with the names
from_pretrained ignores ignored (transformers' modeling_utils.py,
_adjust_missing_and_unexpected_keys), and the base model's prefix matched as
from_pretrained matches it."""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Set

import torch

from ._errors import Error, ErrorCode


def _entry(archive, entry: Optional[str]) -> Optional[str]:
    """The entry load_into binds, where it is plain; None where load_into must
    choose among several."""
    if entry:
        return entry
    entries = archive.entries
    if len(entries) == 1:
        return entries[0]
    return "model" if "model" in entries else None


def _patterns(model, attribute: str, extra=()) -> Optional["re.Pattern"]:
    """One regex of the class's ``attribute`` list (and ``extra``), as
    from_pretrained joins them; None for none."""
    found = list(getattr(model, attribute, None) or ()) + list(extra)
    if not found:
        return None
    return re.compile("|".join(f"({p})" for p in found))


def _non_persistent(model) -> Set[str]:
    """Names of the model's non-persistent buffers (in no state_dict)."""
    out = set()
    for prefix, module in model.named_modules():
        for name in module._non_persistent_buffers_set:
            if module._buffers.get(name) is not None:
                out.add(f"{prefix}.{name}" if prefix else name)
    return out


def _prefixes(model, names: List[str], stored: Set[str]):
    """(archive_prefix, module_prefix) from the class's base_model_prefix,
    as from_pretrained adds or strips it: the choice that matches the most
    names ("" and "" where none matches more than the names as they are)."""
    p = getattr(model, "base_model_prefix", "")
    if not isinstance(p, str) or not p:
        return "", ""
    dot = p + "."
    plain = sum(n in stored for n in names)
    strip = sum(dot + n in stored for n in names)  # a base model, an archive of a model with a head
    add = sum(n[len(dot):] in stored for n in names if n.startswith(dot))  # the other way round
    if strip > plain and strip >= add:
        return dot, ""
    if add > plain:
        return "", dot
    return "", ""


def _materialize(model, names: List[str]) -> None:
    """Parameters among ``names`` still on meta made on the CPU and
    initialized by the class's _init_weights, as from_pretrained initializes
    what a checkpoint lacks."""
    owners, made = {}, {}  # id(meta tensor) -> its CPU replacement
    for name in names:
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        t = owner._parameters.get(leaf)
        if t is None:
            t = owner._buffers.get(leaf)
        if t is not None and t.is_meta and id(t) not in made:
            real = torch.empty(t.shape, dtype=t.dtype)
            if isinstance(t, torch.nn.Parameter):
                real = torch.nn.Parameter(real, requires_grad=t.requires_grad)
            made[id(t)] = real
            owners[id(owner)] = owner
    if not made:
        return
    # torch cannot set_data a meta tensor to a CPU one: every place that
    # holds it (a tie included) gets the new tensor.
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for key, value in table.items():
                if value is not None and id(value) in made:
                    table[key] = made[id(value)]
    init = getattr(model, "_init_weights", None)
    if init is not None:
        with torch.no_grad():
            for owner in owners.values():
                init(owner)


def _list(names: List[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return f"{shown}, ... {len(names) - most} more" if len(names) > most else shown


def bind(model, archive, device, kwargs: Dict) -> None:
    """tsar.load_into(model, archive, device=device, **kwargs), where a
    stored tensor from_pretrained would ignore is no mismatch (the model's
    non-persistent buffers, the class's _keys_to_ignore_on_load_unexpected,
    position_ids and rotary_emb.inv_freq; _keys_to_ignore_on_load_missing
    for tensors the archive lacks)."""
    import tsar

    kwargs = dict(kwargs)
    strict = kwargs.pop("strict", True)
    entry = _entry(archive, kwargs.get("entry"))
    if entry is None:  # several entries and none named: load_into chooses, and says why not
        tsar.load_into(model, archive, device=device, strict=strict, **kwargs)
        return
    stored = set(archive.keys(entry))
    items = [(n, t) for n, t in model.state_dict(keep_vars=True).items()
             if isinstance(t, torch.Tensor)]
    names = [n for n, _ in items]
    auto_prefix = "archive_prefix" not in kwargs and "module_prefix" not in kwargs
    if auto_prefix:
        kwargs["archive_prefix"], kwargs["module_prefix"] = _prefixes(model, names, stored)
    ap, mp = str(kwargs.get("archive_prefix", "")), str(kwargs.get("module_prefix", ""))
    module_names = set(names)

    buffers = [n for n, _ in model.named_buffers()]
    extra = []
    if any(n.endswith("rotary_emb.inv_freq") for n in buffers):
        extra.append(r"rotary_emb\.inv_freq")
    if any(n.endswith("position_ids") for n in buffers):
        extra.append(r"(^|\.)position_ids$")
    unexpected_re = _patterns(model, "_keys_to_ignore_on_load_unexpected", extra)
    missing_re = _patterns(model, "_keys_to_ignore_on_load_missing")
    loose = _non_persistent(model)

    ignored_unexpected = set()
    for a in stored:
        m = mp + a[len(ap):] if a.startswith(ap) else None
        if m is not None and m in module_names:
            continue
        if m is None:
            # Outside the base model's prefix: the head's tensors, when the
            # base model was asked for (from_pretrained leaves them too).
            if auto_prefix and ap:
                ignored_unexpected.add(a)
        elif m in loose or (unexpected_re is not None
                            and (unexpected_re.search(a) or unexpected_re.search(m))):
            ignored_unexpected.add(a)
    ignored_missing = set()
    if missing_re is not None:
        for m in names:
            a = ap + m[len(mp):] if m.startswith(mp) else None
            if (a is None or a not in stored) and missing_re.search(m):
                ignored_missing.add(m)
    if not strict or not (ignored_unexpected or ignored_missing):
        tsar.load_into(model, archive, device=device, strict=strict, **kwargs)
        return
    ignored = (ignored_unexpected, ignored_missing)
    if int(kwargs.get("world", 0) or 0) <= 1:  # a rank's shapes are its slices': load_into's to check
        _refuse_differences(archive, entry, items, ap, mp, ignored)
    if ignored_missing:
        _materialize(model, sorted(ignored_missing))
    report = tsar.load_into(model, archive, device=device, strict=False, **kwargs)
    missing = [n for n in report.missing if n not in ignored_missing]
    unexpected = [n for n in report.unexpected if n not in ignored_unexpected]
    if missing or unexpected or report.mismatched:
        raise _mismatch(archive, entry, missing, unexpected, report.mismatched, ignored, "")


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _refuse_differences(archive, entry, items, ap, mp, ignored) -> None:
    """BIND_MISMATCH before anything is bound, listing what strict load_into
    would list less what from_pretrained ignores: names missing (not tied to
    a name the archive holds), not in the module, of another shape or dtype."""
    infos = {i.name: i for i in archive.infos() if i.entry == entry}
    stored = archive.keys(entry)
    held, used, mismatched = set(), set(), []
    for m, t in items:
        a = ap + m[len(mp):] if m.startswith(mp) else None
        info = infos.get(a) if a is not None else None
        if info is None:
            continue
        used.add(a)
        held.add(id(t))
        if t.dtype != info.dtype:
            mismatched.append(f"{m}: dtype {str(t.dtype)[6:]} vs archive {str(info.dtype)[6:]}")
        elif tuple(t.shape) != tuple(info.shape):
            mismatched.append(f"{m}: shape {_shape(t.shape)} vs archive {_shape(info.shape)}")
    used.update(a for a in stored if a not in infos)  # sparse: load_into's to judge
    missing = []
    for m, t in items:
        a = ap + m[len(mp):] if m.startswith(mp) else None
        if (a is None or a not in used) and m not in ignored[1] and id(t) not in held:
            missing.append(m)
    unexpected = [a for a in stored if a not in used and a not in ignored[0]]
    if missing or unexpected or mismatched:
        raise _mismatch(archive, entry, missing, unexpected, mismatched, ignored,
                        " Nothing was changed")


def _mismatch(archive, entry, missing, unexpected, mismatched, ignored, tail) -> Error:
    """load_into's BIND_MISMATCH message, saying what was left out as
    from_pretrained leaves it."""
    from ._portable_bind import mismatch_message  # load_into's words, on either path

    left = sorted(ignored[0]) + sorted(ignored[1])
    msg = (mismatch_message(entry, missing, unexpected, mismatched)
           + f" (left out as from_pretrained leaves them: {_list(left)}).{tail}")
    return Error(f"{archive.path}: {msg}", ErrorCode.BIND_MISMATCH, archive.path)
