"""torchao's quantized tensors as tsar keeps them (issue 58).

A torchao weight (``Int8Tensor``, ``IntxUnpackedToInt8Tensor``,
``Float8Tensor``, the ``Int4*Tensor`` classes) is a tensor subclass made of
plain inner tensors (``qdata``, ``scale``, ``zero_point``...) and a few
attributes (block size, dtypes, enums, small dataclasses). tsar keeps it as a
*group*: the class's name in a closed table (CLASSES), its inner tensors, its
attributes as a typed tree of plain values (``encode``), and the outer shape,
stride and dtype. A group becomes the subclass again only through that table
(``rebuild``): nothing read from an archive names a module to import or a
callable to run, and a class, enum or dataclass the table does not list is
refused, naming the tensor, the class and the torchao version that wrote it.

The typed tree is JSON: ``None``, ``bool``, ``int`` and ``str`` stand for
themselves, and every other value is a list whose first item says what it is:
``["float", hex]`` (``float.hex``: exact, NaN and infinities included),
``["list", [items]]``, ``["tuple", [items]]``, ``["dtype", "float32"]``,
``["size", [ints]]`` (a ``torch.Size``), ``["enum", NAME, MEMBER]``,
``["record", NAME, {field: value}]`` (a dataclass or named tuple of RECORDS).

torchao is imported only to rebuild a group, never by ``import tsar``.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch

from ._errors import Error, ErrorCode


class Class(NamedTuple):
    """One torchao tensor class: where it lives and what its constructor
    takes (torchao's ``tensor_data_names``, ``optional_tensor_data_names``,
    ``tensor_attribute_names``, ``optional_tensor_attribute_names``)."""
    module: str
    tensors: Tuple[str, ...]
    optional_tensors: Tuple[str, ...]
    attributes: Tuple[str, ...]
    optional_attributes: Tuple[str, ...]


_Q = "torchao.quantization"

# The classes tsar stores and rebuilds, checked against the pinned torchao by
# tests/python/test_torchao_groups.py. A class is unknown until it has a row.
CLASSES: Dict[str, Class] = {
    "Int8Tensor": Class(_Q, ("qdata", "scale"),
                        ("zero_point", "act_quant_scale", "act_quant_zero_point", "act_pre_scale"),
                        ("block_size", "dtype"), ("act_quant_kwargs", "reduce_range")),
    "IntxUnpackedToInt8Tensor": Class(_Q, ("qdata", "scale", "zero_point"), (),
                                      ("target_dtype", "block_size", "dtype",
                                       "activation_quantization"), ()),
    "Float8Tensor": Class(_Q, ("qdata", "scale"), (), (),
                          ("block_size", "mm_config", "act_quant_kwargs", "kernel_preference",
                           "dtype")),
    "Int4Tensor": Class(_Q, ("qdata", "scale", "zero_point"), ("act_pre_scale",),
                        ("block_size", "shape"), ("activation_dtype",)),
    "Int4PlainInt32Tensor": Class(_Q, ("qdata", "scale", "zero_point"), ("act_pre_scale",),
                                  ("block_size", "shape"), ()),
    "Int4PreshuffledTensor": Class(_Q, ("qdata", "group_scale"), ("group_zero", "row_scale"),
                                   ("block_size", "shape"), ()),
    "Int4TilePackedTo4dTensor": Class(_Q, ("qdata", "scale_and_zero"), ("act_pre_scale",),
                                      ("block_size", "shape"), ()),
}

# The enums and records (dataclasses, named tuples) an attribute may hold:
# name -> (module, class name in it).
_W = "torchao.quantization.quantize_.workflows"
ENUMS: Dict[str, Tuple[str, str]] = {
    "MappingType": ("torchao.quantization.quant_primitives", "MappingType"),
    "KernelPreference": ("torchao.quantization.quantize_.common.kernel_preference",
                         "KernelPreference"),
    "IntxUnpackedToInt8TensorActivationQuantization": (
        f"{_W}.intx.intx_unpacked_to_int8_tensor",
        "IntxUnpackedToInt8TensorActivationQuantization"),
}
RECORDS: Dict[str, Tuple[str, str]] = {
    "PerRow": ("torchao.quantization.granularity", "PerRow"),
    "PerTensor": ("torchao.quantization.granularity", "PerTensor"),
    "PerGroup": ("torchao.quantization.granularity", "PerGroup"),
    "PerAxis": ("torchao.quantization.granularity", "PerAxis"),
    "PerBlock": ("torchao.quantization.granularity", "PerBlock"),
    "PerToken": ("torchao.quantization.granularity", "PerToken"),
    "QuantizeTensorToInt8Kwargs": (f"{_W}.int8.int8_tensor", "QuantizeTensorToInt8Kwargs"),
    "QuantizeTensorToFloat8Kwargs": (f"{_W}.float8.float8_tensor",
                                     "QuantizeTensorToFloat8Kwargs"),
    "Float8MMConfig": ("torchao.float8.inference", "Float8MMConfig"),
}


class Group(NamedTuple):
    """A torchao tensor taken apart: what an archive stores of it."""
    cls: str  # a key of CLASSES
    tensors: Dict[str, torch.Tensor]  # inner tensors, plain (not subclasses)
    attributes: Dict[str, Any]  # name -> typed tree (module docstring)
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: torch.dtype
    torchao: str  # the version that made it


def _torchao_version() -> str:
    m = sys.modules.get("torchao")
    return getattr(m, "__version__", "unknown") if m is not None else "not imported"


def class_of(t: torch.Tensor) -> Optional[str]:
    """The CLASSES key of ``t``'s type, or None: never imports torchao (a
    tensor of one of its classes means it is imported already)."""
    cls = type(t)
    row = CLASSES.get(cls.__name__)
    if row is None or cls.__module__.split(".")[0] != "torchao":
        return None
    return cls.__name__ if _import(row.module, cls.__name__) is cls else None


def flatten(name: str, t: torch.Tensor) -> Group:
    """``t`` (a tensor of a CLASSES class) as a Group; UNSUPPORTED naming
    ``name`` and the class for any other subclass with inner tensors."""
    key = class_of(t)
    if key is None:
        cls = type(t)
        raise Error(f"tensor {name!r} is a {cls.__module__}.{cls.__qualname__}, a tensor subclass "
                    f"tsar does not know: it stores plain tensors and torchao's "
                    f"{', '.join(sorted(CLASSES))}", ErrorCode.UNSUPPORTED)
    names, context = t.__tensor_flatten__()
    row = CLASSES[key]
    allowed = set(row.tensors) | set(row.optional_tensors)
    known = row.attributes + row.optional_attributes
    odd = [n for n in names if n not in allowed] + [n for n in context if n not in known]
    if odd:
        raise Error(f"tensor {name!r} ({key}, torchao {_torchao_version()}): holds "
                    f"{', '.join(map(repr, odd))}, which tsar's table of {key} does not list",
                    ErrorCode.UNSUPPORTED)
    tensors = {}
    with torch._C.DisableTorchFunctionSubclass():
        for n in names:
            inner = getattr(t, n)
            if type(inner) is not torch.Tensor and type(inner) is not torch.nn.Parameter:
                raise Error(f"tensor {name!r} ({key}): inner tensor {n!r} is a "
                            f"{type(inner).__name__}, not a plain tensor", ErrorCode.UNSUPPORTED)
            tensors[n] = inner
        shape, stride, dtype = tuple(t.shape), tuple(t.stride()), t.dtype
    attributes = {k: encode(v, f"tensor {name!r} ({key}) attribute {k!r}")
                  for k, v in context.items()}
    return Group(key, tensors, attributes, shape, stride, dtype, _torchao_version())


# spec §4.13.2: the members of a group's description, and its library.
_DESCRIPTION_KEYS = ("attributes", "class", "library", "members", "version")
LIBRARY = "torchao"


def describe(g: Group) -> str:
    """The description of ``g`` as the archive stores it (spec §4.13.2,
    §4.9 rule 17): JSON with sorted keys and no whitespace, so that equal
    groups give equal bytes."""
    return json.dumps({"library": LIBRARY, "version": g.torchao, "class": g.cls,
                       "members": list(g.tensors), "attributes": g.attributes},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# Descriptions already found well-formed, by text (the decoder makes fresh
# values from them each time: nothing read from here is handed out).
_PARSED: Dict[str, dict] = {}


def _parsed(name: str, text: str, count: int) -> dict:
    """The description ``text`` as JSON of spec §4.13.2's form, for a group
    of ``count`` members; tsar.Error naming ``name`` otherwise."""
    def fail(why):
        return Error(f"tensor {name!r}: description (spec §4.13.2): {why}",
                     ErrorCode.INVALID_VALUE)

    try:
        d = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:
        raise fail(f"expected JSON, found {type(e).__name__}: {e}") from None
    if type(d) is not dict or sorted(d) != list(_DESCRIPTION_KEYS):
        found = sorted(d) if type(d) is dict else type(d).__name__
        raise fail(f"expected an object with exactly {', '.join(_DESCRIPTION_KEYS)}, found {found}")
    for key in ("class", "library", "version"):
        if type(d[key]) is not str:
            raise fail(f"{key}: expected a string, found {type(d[key]).__name__}")
    if d["library"] != LIBRARY:
        raise Error(f"tensor {name!r}: a {d['library']} {d['class']} (version {d['version']}): "
                    f"tsar rebuilds {LIBRARY}'s classes only", ErrorCode.UNSUPPORTED)
    members = d["members"]
    if type(members) is not list or len(members) != count or \
            any(type(m) is not str or not m for m in members) or len(set(members)) != len(members):
        raise fail(f"members: expected {count} distinct non-empty names, one per member "
                   f"tensor, found {members!r}")
    if type(d["attributes"]) is not dict:
        raise fail(f"attributes: expected an object, found {type(d['attributes']).__name__}")
    return d


def _unique_keys(pairs):
    """An object of a description, whose keys spec §4.13.2 makes unique
    (json.loads would keep the last of two silently)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {twice!r} twice in one object")
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse(name: str, text: str, tensors: Dict[str, torch.Tensor], shape, stride,
          dtype: torch.dtype) -> Group:
    """The Group that a description (spec §4.13.2) and the group record's
    members, shape, stride and dtype make. ``tensors`` maps each member's
    archive name (``w.qdata``) to its tensor, in component order.
    tsar.Error naming the group: INVALID_VALUE for a description that breaks
    the grammar, UNSUPPORTED for a library other than torchao."""
    def fail(why):
        return Error(f"tensor {name!r}: description (spec §4.13.2): {why}",
                     ErrorCode.INVALID_VALUE)

    d = _PARSED.get(text)
    if d is None:
        d = _parsed(name, text, len(tensors))
        if len(text) <= 4096:  # bounded, as _CHECKED: torchao's are ~200 bytes
            if len(_PARSED) >= 4096:
                _PARSED.clear()
            _PARSED[text] = d
    elif len(d["members"]) != len(tensors):
        raise fail(f"members: expected {len(tensors)} distinct non-empty names, one per member "
                   f"tensor, found {d['members']!r}")
    members = d["members"]
    return Group(d["class"], dict(zip(members, tensors.values())), d["attributes"], tuple(shape),
                 tuple(stride), dtype, d["version"])


def encode(value, where: str = "value"):
    """``value`` as a typed tree (module docstring); UNSUPPORTED for a type
    the tree does not hold."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return ["float", value.hex()]
    if isinstance(value, torch.dtype):
        return ["dtype", str(value).replace("torch.", "")]
    if isinstance(value, torch.Size):
        return ["size", list(value)]
    if type(value) in (list, tuple):
        return [type(value).__name__, [encode(v, where) for v in value]]
    cls = type(value)
    if isinstance(value, enum.Enum) and ENUMS.get(cls.__name__) == (cls.__module__, cls.__name__):
        return ["enum", cls.__name__, value.name]
    if RECORDS.get(cls.__name__) == (cls.__module__, cls.__name__):
        if dataclasses.is_dataclass(value):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        else:  # a named tuple
            fields = value._asdict()
        return ["record", cls.__name__, {k: encode(v, where) for k, v in fields.items()}]
    raise Error(f"{where}: a {cls.__module__}.{cls.__qualname__}, which tsar cannot store (it "
                "stores None, bools, ints, floats, strings, lists, tuples, dtypes and the enums "
                "and records of tsar's torchao table)", ErrorCode.UNSUPPORTED)


_IMPORTED: Dict[Tuple[str, str], Any] = {}


def _import(module: str, name: str):
    """``name`` of ``module``, both from tsar's tables, never from a file
    (kept: a bind looks up one class per quantized weight)."""
    key = (module, name)
    found = _IMPORTED.get(key)
    if found is None:
        found = _IMPORTED[key] = getattr(importlib.import_module(module), name)
    return found


class _Decoder:
    """A typed tree back to values, for one tensor (``where`` names it)."""

    MAX_DEPTH = 32  # torchao's attributes nest 3 deep (a record in a record)

    def __init__(self, where: str):
        self.where = where
        self.depth = 0

    def fail(self, why: str) -> Error:
        where = self.where() if callable(self.where) else self.where
        return Error(f"{where}: {why}", ErrorCode.INVALID_VALUE)

    def __call__(self, tree):
        if type(tree) is int and not -2**63 <= tree < 2**63:
            raise self.fail(f"expected an integer of int64, found {tree}")
        if tree is None or type(tree) in (bool, int, str):
            return tree
        if self.depth >= self.MAX_DEPTH:
            raise self.fail(f"values nested more than {self.MAX_DEPTH} deep")
        self.depth += 1
        try:
            return self._typed(tree)
        finally:
            self.depth -= 1

    def _typed(self, tree):
        if type(tree) is not list or not tree or type(tree[0]) is not str:
            raise self.fail(f"expected a typed value, found {type(tree).__name__}")
        tag, args = tree[0], tree[1:]
        if tag == "float" and len(args) == 1 and type(args[0]) is str:
            try:
                return float.fromhex(args[0])
            except ValueError:
                raise self.fail(f"float: expected a float.hex() string, found "
                                f"{args[0]!r}") from None
        if tag in ("list", "tuple") and len(args) == 1 and type(args[0]) is list:
            items = [self(v) for v in args[0]]
            return items if tag == "list" else tuple(items)
        if tag == "dtype" and len(args) == 1 and type(args[0]) is str:
            d = getattr(torch, args[0], None)
            if not isinstance(d, torch.dtype):
                raise self.fail(f"dtype: expected a dtype of this torch ({torch.__version__}), "
                                f"found {args[0]!r}")
            return d
        if tag == "size" and len(args) == 1 and type(args[0]) is list \
                and all(type(v) is int for v in args[0]):
            return torch.Size(args[0])
        if tag == "enum" and len(args) == 2 and all(type(a) is str for a in args):
            where = ENUMS.get(args[0])
            if where is None:
                raise self.fail(f"enum {args[0]!r} is not one of tsar's torchao table "
                                f"({', '.join(sorted(ENUMS))})")
            cls = _import(*where)
            if args[1] not in cls.__members__:
                raise self.fail(f"enum {args[0]} of this torchao has no member {args[1]!r}")
            return cls[args[1]]
        if tag == "record" and len(args) == 2 and type(args[0]) is str and type(args[1]) is dict:
            where = RECORDS.get(args[0])
            if where is None:
                raise self.fail(f"record {args[0]!r} is not one of tsar's torchao table "
                                f"({', '.join(sorted(RECORDS))})")
            cls = _import(*where)
            fields = {k: self(v) for k, v in args[1].items()}
            try:
                return cls(**fields)
            except TypeError as e:
                raise self.fail(f"record {args[0]} of this torchao does not take these fields "
                                f"({e})") from None
        raise self.fail(f"expected a typed value, found tag {tag!r} with {len(args)} items")


def rebuild(name: str, group: Group) -> torch.Tensor:
    """The torchao tensor of ``group`` (its inner tensors used as they are,
    no copy), made only through CLASSES. tsar.Error naming ``name``, the
    class and the torchao version that wrote it: UNSUPPORTED for a class not
    in the table or without torchao, INVALID_VALUE for attributes or inner
    tensors this torchao's class does not take."""
    return _make(name, _recipe(name, group), list(group.tensors.values()), group.shape,
                 group.stride, group.dtype)


class _Recipe(NamedTuple):
    """What rebuilding a group of one description takes, worked out once:
    the class, the member names, the attributes decoded with the
    constructor's defaults filled in, and which of them hold a list or a
    record, decoded again for each tensor (a tensor is never handed
    another's mutable attribute)."""
    cls: type
    members: Tuple[str, ...]
    attributes: Dict[str, Any]
    fresh: Dict[str, Any]  # attribute -> its typed tree, decoded per tensor
    here: str  # the class and versions, for messages


_RECIPES: Dict[str, _Recipe] = {}


def _mutable(tree) -> bool:
    """Whether a typed tree (already decoded once: at most 32 deep) holds a
    list or a record anywhere."""
    if type(tree) is dict:
        return any(_mutable(v) for v in tree.values())
    if type(tree) is list:
        return (bool(tree) and tree[0] in ("list", "record")) or any(_mutable(v) for v in tree)
    return False


def _recipe(name: str, group: Group) -> _Recipe:
    """``group``'s class (through CLASSES: _checked), members and attributes,
    decoded, with the constructor's default for each optional attribute the
    group leaves out; tsar.Error naming ``name`` otherwise."""
    written = "written by torchao " + group.torchao
    cls, row = _checked(name, group, written)
    here = f"{group.cls}, {written}, read with torchao {_torchao_version()}"
    decode = _Decoder(f"tensor {name!r} ({here})")
    attributes = {k: decode(v) for k, v in group.attributes.items()}
    for k in row.optional_attributes:  # absent: the constructor's default
        if k not in attributes:
            attributes[k] = _default(cls, k)
    fresh = {k: v for k, v in group.attributes.items() if _mutable(v)}
    return _Recipe(cls, tuple(group.tensors), attributes, fresh, here)


def rebuild_described(name: str, text: str, tensors: List[torch.Tensor], shape, stride,
                      dtype: torch.dtype) -> torch.Tensor:
    """What ``rebuild(name, parse(name, text, ...))`` gives, for a group
    read from an archive: its description ``text`` and its member tensors in
    component order. A model's quantized weights share a few descriptions, so
    what one description decides is worked out once (bounded, as _CHECKED)."""
    r = _RECIPES.get(text)
    if r is None or len(r.members) != len(tensors):
        r = _recipe(name, parse(name, text, {str(i): t for i, t in enumerate(tensors)}, shape,
                                stride, dtype))
        if len(text) <= 4096:
            if len(_RECIPES) >= 4096:
                _RECIPES.clear()
            _RECIPES[text] = r
    return _make(name, r, tensors, shape, stride, dtype)


def _make(name, r: _Recipe, tensors, shape, stride, dtype) -> torch.Tensor:
    """The tensor of recipe ``r`` over ``tensors`` (in member order): its
    mutable attributes decoded afresh, the rest shared; its outer shape and
    dtype checked against the record's."""
    attributes = dict(r.attributes)
    if r.fresh:
        decode = _Decoder(lambda: f"tensor {name!r} ({r.here})")
        for k, tree in r.fresh.items():
            attributes[k] = decode(tree)
    try:
        out = r.cls.__tensor_unflatten__(dict(zip(r.members, tensors)), attributes,
                                         torch.Size(shape), tuple(stride))
    except Exception as e:  # noqa: BLE001 - torchao's own checks, reported as the file's fault
        raise Error(f"tensor {name!r} ({r.here}): torchao refused its inner tensors and "
                    f"attributes: {type(e).__name__}: {e}", ErrorCode.INVALID_VALUE) from None
    with torch._C.DisableTorchFunctionSubclass():  # the subclass's own shape: 0.3 us, not 2.4
        wrong = tuple(out.shape) != tuple(shape) or out.dtype != dtype
    if wrong:
        raise Error(f"tensor {name!r} ({r.here}): rebuilt as {list(out.shape)} {out.dtype}, "
                    f"expected {list(shape)} {dtype}", ErrorCode.INVALID_VALUE)
    return out


# What _checked found right, by (class, version, tensor names, attribute
# names): a model's quantized weights share a handful of such forms, and a
# bind rebuilds one weight per linear layer. Bounded: a hostile archive of
# a million forms cannot grow it without end.
_CHECKED: Dict[tuple, tuple] = {}


def _checked(name: str, group: Group, written: str):
    """(class, its CLASSES row) for ``group``, whose inner tensors and
    attributes that row takes; tsar.Error naming ``name`` otherwise."""
    key = (group.cls, group.torchao, tuple(group.tensors), tuple(group.attributes))
    found = _CHECKED.get(key)
    if found is not None:
        return found
    row = CLASSES.get(group.cls)
    if row is None:
        raise Error(f"tensor {name!r}: class {group.cls!r} ({written}) is not in tsar's table "
                    f"of torchao classes ({', '.join(sorted(CLASSES))})", ErrorCode.UNSUPPORTED)
    try:
        cls = _import(row.module, group.cls)
    except ImportError as e:
        raise Error(f"tensor {name!r} is a torchao {group.cls} ({written}): reading it needs "
                    f"torchao (pip install torchao): {e}", ErrorCode.UNSUPPORTED) from None
    here = f"tensor {name!r} ({group.cls}, {written}, read with torchao {_torchao_version()})"
    missing = [n for n in row.tensors if n not in group.tensors]
    extra = [n for n in group.tensors if n not in row.tensors + row.optional_tensors]
    attrs = set(row.attributes + row.optional_attributes)
    missing += [n for n in row.attributes if n not in group.attributes]
    extra += [n for n in group.attributes if n not in attrs]
    if missing or extra:
        raise Error(f"{here}: " + "; ".join(
            s for s in (missing and f"missing {', '.join(missing)}",
                        extra and f"this torchao's class does not take {', '.join(extra)}") if s),
                    ErrorCode.INVALID_VALUE)
    if len(_CHECKED) >= 4096:
        _CHECKED.clear()
    _CHECKED[key] = (cls, row)
    return cls, row


_DEFAULTS: Dict[Tuple[type, str], Any] = {}  # (class, attribute) -> its constructor's default


def _default(cls, attribute: str):
    key = (cls, attribute)
    if key not in _DEFAULTS:  # inspect.signature costs ~50 us: once per class and attribute
        import inspect

        p = inspect.signature(cls.__init__).parameters.get(attribute)
        _DEFAULTS[key] = None if p is None or p.default is inspect.Parameter.empty else p.default
    return _DEFAULTS[key]
