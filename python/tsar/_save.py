"""tsar.save (tensors in memory -> archive) and tsar.pack (files -> archive)."""
from __future__ import annotations

import collections.abc
import json
import os
from typing import List, NamedTuple, Optional, Sequence

import torch

from . import _backend
from ._errors import Error, ErrorCode

_ROLE_TENSOR, _ROLE_PARAMETER, _ROLE_BUFFER = 0, 1, 2
_INT64 = (-(2**63), 2**63 - 1)


def _metadata_items(metadata):
    """Checks archive metadata in Python, so a bad value is a TypeError naming its key."""
    if metadata is None:
        return []
    if not isinstance(metadata, collections.abc.Mapping):
        raise TypeError(f"metadata: expected a dict of str to str, int, float or bytes, found {type(metadata).__name__}")
    items = []
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise TypeError(f"metadata key {key!r}: expected str, found {type(key).__name__}")
        if isinstance(value, bool) or not isinstance(value, (str, int, float, bytes)):
            raise TypeError(
                f"metadata {key!r}: expected str, int, float or bytes, found {type(value).__name__}"
                + (" (store it as an int)" if isinstance(value, bool) else "")
            )
        if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
            raise OverflowError(f"metadata {key!r}: expected a 64-bit signed integer, found {value}")
        items.append((key, value))
    return items


def _module_tensors(module: torch.nn.Module):
    # state_dict(keep_vars=True): Python's own names and order (parameters, then
    # persistent buffers, module by module), the Parameter objects themselves.
    out = []
    for name, t in module.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):  # a submodule's get_extra_state()
            raise TypeError(
                f"save: the module's state_dict() holds {name!r}, a {type(t).__name__}, not a Tensor "
                f"(extra state, from get_extra_state()): an archive holds tensors only. Save the "
                f"tensors, tsar.save({{k: v for k, v in module.state_dict().items() if "
                f"isinstance(v, torch.Tensor)}}, path), and keep the extra state apart; load_into "
                f"binds such a module and leaves its extra state alone")
        out.append((name, t, _ROLE_PARAMETER if isinstance(t, torch.nn.Parameter) else _ROLE_BUFFER))
    return out


def _state_dict_tensors(entry, sd):
    out = []
    for name, t in sd.items():
        if not isinstance(name, str):
            raise TypeError(f"entry {entry!r}: key {name!r}: expected str, found {type(name).__name__}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"entry {entry!r}: {name!r}: expected a Tensor, found {type(t).__name__}")
        # As `tsar pack` does for a torch.save file: a Parameter keeps its role.
        out.append((name, t, _ROLE_PARAMETER if isinstance(t, torch.nn.Parameter) else _ROLE_TENSOR))
    return out


def _torch_metadata(entry, sd):
    # An OrderedDict state_dict's _metadata (module versions, read by
    # load_state_dict), kept as `tsar pack` keeps it: compact JSON.
    md = getattr(sd, "_metadata", None)
    if md is None:
        return []
    return [(entry, "torch._metadata", json.dumps(md, separators=(",", ":"), ensure_ascii=False))]


def _entries(obj, entry):
    """(entries, entry metadata) for whatever save() was given."""
    if isinstance(obj, torch.nn.Module):
        return [(entry, _module_tensors(obj))], []
    if not isinstance(obj, collections.abc.Mapping):
        raise TypeError(
            f"save: expected a state_dict (a mapping of str to Tensor), a torch.nn.Module or a dict "
            f"of entries, found {type(obj).__name__}"
        )
    values = list(obj.values())
    if all(isinstance(v, torch.Tensor) for v in values):
        return [(entry, _state_dict_tensors(entry, obj))], _torch_metadata(entry, obj)
    if all(isinstance(v, (torch.nn.Module, collections.abc.Mapping)) for v in values):
        entries, meta = [], []
        for name, v in obj.items():
            if not isinstance(name, str):
                raise TypeError(f"save: entry name {name!r}: expected str, found {type(name).__name__}")
            if isinstance(v, torch.nn.Module):
                entries.append((name, _module_tensors(v)))
            else:
                entries.append((name, _state_dict_tensors(name, v)))
                meta += _torch_metadata(name, v)
        return entries, meta
    bad = next(k for k, v in obj.items() if not isinstance(v, torch.Tensor))
    raise TypeError(
        f"save: {bad!r} is a {type(obj[bad]).__name__}: expected every value to be a Tensor (one "
        f"state_dict) or every value a state_dict or Module (a dict of entries)"
    )


def _dtype_name(dtype) -> str:
    """'' for None, else the name of a floating dtype ("float16") for PackOptions::dtype."""
    if dtype is None:
        return ""
    allowed = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
    if dtype not in allowed:
        raise ValueError(f"dtype: expected torch.float16, torch.bfloat16 or torch.float32, found {dtype!r}")
    return allowed[dtype]


def _shard_plan(tp, shard):
    """(tp, [(pattern, dim)]) for the C++ side, from ``tp=`` and ``shard=``."""
    if tp is None and not shard:
        return 0, []
    if isinstance(shard, collections.abc.Mapping):
        pairs = list(shard.items())
    else:
        pairs = [tuple(p) for p in (shard or ())]
    plan = []
    for pattern, dim in pairs:
        if not isinstance(pattern, str) or isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"shard: expected {{pattern (str): dim (int)}}, found {pattern!r}: {dim!r}")
        plan.append((pattern, dim))
    if isinstance(tp, bool) or not isinstance(tp, int):
        raise TypeError(f"tp: expected the number of tensor-parallel ranks (an int), found {tp!r}")
    return tp, plan


def _alignment(alignment, tp):
    """The default alignment: 4096, or 2 MiB for a tensor-parallel archive
    (PackOptions::tp says why)."""
    if alignment is not None:
        return int(alignment)
    return 2 << 20 if tp else 4096


def save(obj, path, *, metadata=None, entry: str = "model", alignment: Optional[int] = None,
         dtype=None, base=None, tp: Optional[int] = None, shard=None, programs=None,
         program_entry: Optional[str] = None) -> None:
    """Writes ``obj`` as a .tsar archive at ``path``, atomically.

    ``obj`` is a state_dict (any mapping of str to Tensor; role "tensor", or
    "parameter" for an ``nn.Parameter``), a ``torch.nn.Module`` (its parameters
    and persistent buffers, roles "parameter" and "buffer", named as
    ``state_dict()`` names them) stored as entry ``entry``, or a dict of entries
    ``{entry_name: state_dict_or_module}``. ``metadata`` is archive-level: a dict
    of str to str, int, float or bytes.

    Tensors that share a storage (tied weights, views, transposes) are stored
    once, only the bytes they cover, and load back sharing one storage.
    A torchao quantized weight (``Int8Tensor``, ``IntxUnpackedToInt8Tensor``,
    ``Float8Tensor``, the ``Int4*Tensor`` classes) is stored as a tensor group
    (format 1.5): its inner tensors as tensors ``<name>.qdata``... and a
    description of its class and attributes; it loads back as that class,
    rebuilt through tsar's own table (never by a name read from the file).
    Any other tensor subclass made of inner tensors raises tsar.Error
    (UNSUPPORTED) naming it. The file
    is written next to ``path``, flushed, then renamed into place (published
    read-only, 0444): ``path`` holds the old file or the complete new one, never
    a half-written one. The same tensors give the same bytes as C++
    ``tsar::pack`` and as ``tsar pack`` of a torch.save of the same state_dict.

    ``dtype`` (``torch.float16``, ``torch.bfloat16`` or ``torch.float32``):
    every floating-point tensor is stored as that dtype, storage by storage, so
    shared storages stay shared; integer, bool and complex tensors as they are
    (``PackOptions::dtype``, ``tsar pack --dtype``).

    ``base`` (a path to a .tsar archive): write ``path`` as a layer over it
    (``PackOptions::base``, ``tsar pack --base``). Storages whose bytes equal
    one of the base's are not written but taken from the base, so every
    process that opens any layer over one base shares the base's pages. The
    layer records the base's path relative to its own directory and the
    base's identity, and opens only with exactly that base.

    ``tp`` and ``shard`` (tensor parallelism, format 1.4): ``tp=W`` ranks and
    ``shard={pattern: dim}``. Every tensor whose name matches a pattern (a
    shell glob: ``*`` also matches dots; the first pattern that matches
    decides; a negative dim counts from the end) is split along ``dim`` into W
    equal slices, stored so that each rank's slice is one contiguous run of
    the file starting on an alignment boundary; every other tensor is stored
    once for all ranks. :meth:`Archive.shard` and ``load_into(..., rank=,
    world=)`` then map only a rank's runs. ``alignment`` then defaults to 2
    MiB instead of 4096: the kernel maps the cached pages around a fault
    (fault-around, large folios of up to 2 MiB), so slices that start on
    2 MiB keep a rank off its neighbours' pages (the padding is zeros that
    no process reads). A pattern that matches nothing, a
    dim out of range, a size not divisible by W, a sparse or non-contiguous
    tensor raise tsar.Error (INVALID_ARGUMENT) naming it. For a LLaMA-style
    decoder, see ``samples/tp/llama.plan.json``.

    Raises:
        TypeError / OverflowError: an object or metadata value tsar cannot store.
        tsar.Error: INVALID_ARGUMENT (bad names, alignment), UNSUPPORTED
            (quantized or meta tensors), IO.
    """
    if programs:
        return _with_programs(path, programs, program_entry or entry, metadata,
                              lambda tmp, md: save(obj, tmp, metadata=md, entry=entry,
                                                   alignment=alignment, dtype=dtype, base=base,
                                                   tp=tp, shard=shard))
    entries, entry_meta = _entries(obj, entry)
    from . import _portable_save

    groups = _portable_save.has_groups(entries)
    meta = entry_meta + [("", k, v) for k, v in _metadata_items(metadata)]
    world, plan = _shard_plan(tp, shard)
    args = (os.fspath(path), entries, meta, _alignment(alignment, world), _dtype_name(dtype),
            "" if base is None else os.fspath(base), True, world, plan)
    if _backend.accelerator is not None and not groups:
        _backend.accelerator.save(*args)
    else:  # the same writer, fed from Python; the only one that takes groups
        _portable_save.save(*args)


def _with_programs(dst, programs, entry, metadata, write):
    """Writes the archive with the programs' records beside ``dst``, checks
    the programs against its tensors, then publishes it: a mismatch leaves
    ``dst`` untouched."""
    import tempfile

    from . import _programs
    from ._archive import open as tsar_open

    read = _programs.read_all(programs)
    extra = _programs.metadata_items(read, entry)
    merged = dict(metadata or {})
    clash = sorted(set(merged) & set(extra))
    if clash:
        raise Error(f"{os.fspath(dst)}: metadata {clash} would be overwritten by the programs",
                    ErrorCode.INVALID_ARGUMENT, os.fspath(dst))
    merged.update(extra)
    dst = os.fspath(dst)
    fd, tmp = tempfile.mkstemp(prefix=".tsar-programs-", suffix=".tsar",
                               dir=os.path.dirname(os.path.abspath(dst)))
    os.close(fd)
    try:
        result = write(tmp, merged)
        with tsar_open(tmp) as archive:
            if entry not in archive.entries:
                raise Error(f"{dst}: the programs bind entry {entry!r}, which the archive lacks "
                            f"(entries: {list(archive.entries)}; program_entry= names another)",
                            ErrorCode.NOT_FOUND, dst)
            _programs.check(read, archive, entry, dst)
        os.replace(tmp, dst)
        if isinstance(result, PackSummary):
            dropped = sum(p.dropped for p in read)
            result = result._replace(notes=list(result.notes) + [
                f"programs: {', '.join(f'{p.name} ({p.kind}, {len(p.data)} bytes)' for p in read)}"
                f" stored without their weights ({dropped} weight bytes left out)"])
        return result
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class PackSummary(NamedTuple):
    tensors: int  # tensors written
    entries: List[str]  # entry names, in file order
    nbytes: int  # storage bytes written
    notes: List[str]  # what the inputs held that was skipped, "<input>: <what>"


def pack(
    src,
    dst,
    *,
    entry: str = "model",
    strict: bool = False,
    alignment: Optional[int] = None,
    metadata=None,
    dtype=None,
    only: Sequence[str] = (),
    exclude: Sequence[str] = (),
    strip_prefix: str = "",
    arch=None,
    base=None,
    tp: Optional[int] = None,
    shard=None,
    follow_symlinks: bool = False,
    programs=None,
    program_entry: Optional[str] = None,
) -> PackSummary:
    """What ``tsar pack`` does: imports files and writes one archive at ``dst``.

    ``src`` is a file (torch.save, TorchScript, safetensors or its sharded
    ``*.safetensors.index.json``, HDF5, a directory written by TensorDict's
    ``memmap()`` whose nested keys are joined with '.', a directory written by
    transformers' ``save_pretrained``; detected by content), a list of files, or
    a dict ``{entry_name: file}`` (as ``--entry NAME=FILE``). A file holding one
    state_dict becomes entry ``entry``. A transformers directory gives its
    safetensors weights (one file or the shards of its index) and attaches its
    ``config.json``, ``generation_config.json``, tokenizer files and chat
    templates byte for byte (names ending in .json, .txt, .model, .jinja,
    .tiktoken, up to 64 MiB each; :meth:`Archive.files`, spec §4.7.1); other
    files are listed in ``notes``. :mod:`tsar.transformers` loads such an
    archive back as a model and a tokenizer. Nothing in an input is ever executed:
    torch.save files are read by tsar's own pickle reader, which keeps whole
    checkpoints (optimizer state, args, numpy values...) as a value tree and
    objects it does not interpret as opaque pickle fragments that it never
    runs; ``strict=True`` refuses inputs that would need such fragments, and
    HDF5 and safetensors values that metadata cannot hold (else skipped, listed
    in ``notes``). The output is byte-identical to the CLI's.

    The options are those of ``tsar pack``: ``dtype`` (``--dtype``, a torch
    floating dtype), ``only``/``exclude`` (entry names, ``--only``/``--exclude``),
    ``strip_prefix`` (``--strip-prefix``) and ``arch`` (``--arch``: a path where
    the TorchScript input's architecture is written without its weights) and
    ``base`` (``--base``: write a layer over this archive; see :func:`save`),
    ``tp`` and ``shard`` (``--tp``, ``--shard``: lay the archive out for
    tensor-parallel ranks; see :func:`save`), ``follow_symlinks``
    (``--follow-symlinks``: inside a directory input, follow symbolic links
    that leave it; by default they are refused, naming the link),
    ``programs`` and ``program_entry`` (programs stored without their
    weights and checked against the archive's tensors: see :func:`save`).
    A .tsar input is repacked: without ``base`` a layer comes out standalone.

    Raises tsar.Error: BAD_INPUT naming the input file (and offset where known),
    INVALID_ARGUMENT, IO.
    """
    if programs:
        return _with_programs(dst, programs, program_entry or entry, metadata,
                              lambda tmp, md: pack(src, tmp, entry=entry, strict=strict,
                                                   alignment=alignment, metadata=md, dtype=dtype,
                                                   only=only, exclude=exclude,
                                                   strip_prefix=strip_prefix, arch=arch, base=base,
                                                   tp=tp, shard=shard,
                                                   follow_symlinks=follow_symlinks))
    if isinstance(src, collections.abc.Mapping):
        sources = [(str(k), os.fspath(v)) for k, v in src.items()]
    elif isinstance(src, (str, bytes, os.PathLike)):
        sources = [("", os.fspath(src))]
    else:
        sources = [("", os.fspath(s)) for s in src]
    world, plan = _shard_plan(tp, shard)
    # The readers (HDF5, the zip reader) load here, not at `import tsar`. On
    # the portable path they are the `tsar` command's, without LibTorch.
    # TorchScript inputs and arch= (which LibTorch reads and writes there)
    # go through this process's torch (tsar/_portable_torchscript.py).
    hooks = None
    if _backend.accelerator is not None:
        from . import _tsar_pack as packer
    else:
        from . import _portable_torchscript as hooks
        from . import _tsar_pack_portable as packer

    tensors, entries, nbytes, notes = packer.pack(
        sources, os.fspath(dst), entry, bool(strict), _alignment(alignment, world),
        _metadata_items(metadata),
        _dtype_name(dtype), [str(x) for x in only], [str(x) for x in exclude], str(strip_prefix),
        "" if arch is None else os.fspath(arch), "" if base is None else os.fspath(base),
        world, plan, bool(follow_symlinks), hooks,
    )
    return PackSummary(tensors, entries, nbytes, notes)
