"""Programs inside an archive (issue 60): a torch.export ``ExportedProgram`` or
an AOTInductor package, stored without its weight bytes, bound to the
archive's tensors at load (:mod:`tsar._programs_load`).

The convention (spec/FORMAT.md §4.7.2): a program named NAME is two
archive-level metadata records,

- the attached file ``programs/NAME.pt2`` (§4.7.1): the PT2 archive that
  ``torch.export.save`` or ``torch._inductor.aoti_compile_and_package`` wrote,
  with every weight payload (``data/weights/weight_N``) left out and every
  other member kept byte for byte, rewritten as a deterministic zip;
- the string ``program:NAME``: JSON, the **stamp** (:func:`stamp_of`): the
  kind (``exported`` or ``aoti``), the entry whose tensors it binds, the torch
  version it was made with, for AOTInductor the platform and CPU ISA it was
  compiled for, and the weights it binds (name, dtype, shape), checked against
  the entry's tensors when the archive is written and again at load.

This module is the pack side: reading a program (:func:`read`), stripping
and checking it, the metadata records, and :func:`compile_aoti`, which
compiles an exported program the way tsar binds it (constants outside the
shared object, none inlined into the code).
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import zipfile
from typing import Dict, List, Optional

import torch

from ._errors import Error, ErrorCode

STAMP_PREFIX = "program:"
FILE_DIR = "programs/"
FORMAT = "tsar-program/1"
KINDS = ("exported", "aoti")
TORCH_MATCHES = ("release", "exact", "any")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_MEMBER_LIMIT = 1 << 30   # one member of a program's zip, uncompressed
_TOTAL_LIMIT = 4 << 30    # all of them
_WEIGHT_PAYLOAD = re.compile(r"(^|/)data/weights/weight_[0-9]+$")
_DATE = (1980, 1, 1, 0, 0, 0)


def _error(where, code, message) -> Error:
    return Error(f"{where}: {message}", code, str(where))


def unsupported(aoti: bool = False) -> Optional[str]:
    """Why this torch cannot store or load programs, or None. An exported
    program needs torch's PT2 archives (weights apart, with a payload
    config) and its deserializer; an AOTInductor one only LibTorch's package
    loader with user-managed constants, checked without importing torch's
    Python AOTInductor and export modules (over a second of a process's start)."""
    if aoti:
        loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
        doc = getattr(getattr(loader, "load_constants", None), "__doc__", "") or ""
        if "user_managed" not in doc:
            return (f"torch {torch.__version__}'s AOTInductor cannot take user-managed constants: "
                    "a newer torch (tsar is tested with 2.15)")
        return None
    import importlib

    try:
        serde = importlib.import_module("torch._export.serde.serialize")
        importlib.import_module("torch.export.pt2_archive._package")  # torch.export.save's layout
    except ImportError as e:
        return (f"torch {torch.__version__} lacks what tsar's programs need ({e.name or e}): "
                "a newer torch (tsar is tested with 2.15)")
    lacking = [n for n in ("ExportedProgramDeserializer", "_bytes_to_dataclass")
               if not hasattr(serde, n)]
    if lacking:
        return (f"torch {torch.__version__} lacks what tsar's programs need "
                f"({', '.join(lacking)}): a newer torch (tsar is tested with 2.15)")
    return None


def require(where, aoti: bool = False) -> None:
    why = unsupported(aoti)
    if why:
        raise _error(where, ErrorCode.UNSUPPORTED, why)


def stamp_key(name: str) -> str:
    return STAMP_PREFIX + name


def file_name(name: str) -> str:
    return f"{FILE_DIR}{name}.pt2"


def check_name(name, where="programs") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _error(where, ErrorCode.INVALID_ARGUMENT,
                     f"program name {name!r}: expected 1 to 128 of A-Z a-z 0-9 _ . - "
                     "(not starting with . or -)")
    return name


# --- reading a PT2 zip -------------------------------------------------------

def members(data: bytes, where) -> Dict[str, bytes]:
    """Every member of the zip ``data``, each checked before it is read: a
    plain file, at most 1 GiB uncompressed, 4 GiB in all, no two alike."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise _error(where, ErrorCode.BAD_INPUT, f"not a PT2 archive (a zip): {e}") from None
    out: Dict[str, bytes] = {}
    total = 0
    for info in infos:
        if info.is_dir():
            continue
        if info.file_size > _MEMBER_LIMIT or total + info.file_size > _TOTAL_LIMIT:
            raise _error(where, ErrorCode.BAD_INPUT,
                         f"member {info.filename!r}: {info.file_size} bytes, over tsar's limit "
                         f"for a program ({_MEMBER_LIMIT} each, {_TOTAL_LIMIT} in all)")
        if info.filename in out:
            raise _error(where, ErrorCode.BAD_INPUT, f"member {info.filename!r} twice")
        total += info.file_size
        try:
            out[info.filename] = zf.read(info)
        except (zipfile.BadZipFile, ValueError, OSError, NotImplementedError, RuntimeError) as e:
            raise _error(where, ErrorCode.BAD_INPUT, f"member {info.filename!r}: {e}") from None
    return out


def zip_bytes(files: Dict[str, bytes]) -> bytes:
    """A deterministic zip of ``files`` (stored, in name order, one fixed
    date, torch's random ``.data/serialization_id`` replaced by a digest of
    the rest): the same program gives the same bytes, so archives dedupe."""
    import hashlib

    ids = [n for n in files if n.endswith(".data/serialization_id")]
    if ids:
        digest = hashlib.sha1()
        for name in sorted(n for n in files if n not in ids):
            digest.update(name.encode() + b"\0" + len(files[name]).to_bytes(8, "little"))
            digest.update(files[name])
        files = {**files, **{n: digest.hexdigest().encode() for n in ids}}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_DATE)
            info.external_attr = 0o644 << 16
            zf.writestr(info, files[name])
    return buf.getvalue()


def _under(files: Dict[str, bytes], folder: str, where) -> Dict[str, bytes]:
    """``files`` (one PT2 zip) with their top folder, which torch names after
    the file, renamed ``folder``."""
    top = _one(files, r"^[^/]+/archive_format$", where, "archive_format")[:-len("archive_format")]
    return {folder + n[len(top):]: b for n, b in files.items() if n.startswith(top)}


def _one(files, suffix, where, what) -> str:
    """The one member whose name matches ``suffix``."""
    found = [n for n in files if re.search(suffix, n)]
    if len(found) != 1:
        raise _error(where, ErrorCode.BAD_INPUT,
                     f"expected one {what}, found {len(found)}"
                     + (f" ({', '.join(sorted(found)[:4])})" if found else ""))
    return found[0]


def _json(files, name, where):
    try:
        return json.loads(files[name])
    except (ValueError, UnicodeDecodeError) as e:
        raise _error(where, ErrorCode.BAD_INPUT, f"{name}: not JSON ({e})") from None


# --- payload configs (torch's PT2 schema, read as plain JSON) ---------------

# torch.export's serialized ScalarType codes (torch/_export/serde/schema.py).
_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16",
           7: "float32", 8: "float64", 9: "complex32", 10: "complex64", 11: "complex128",
           12: "bool", 13: "bfloat16", 28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2",
           31: "float8_e4m3fnuz", 32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32",
           35: "uint64"}


def _dtype(code, where):
    dtype = getattr(torch, _DTYPES.get(code, "") if isinstance(code, int) else "", None)
    if not isinstance(dtype, torch.dtype):
        raise _error(where, ErrorCode.BAD_INPUT, f"dtype code {code!r} unknown to tsar and "
                     f"torch {torch.__version__}")
    return dtype


def _ints(values, where, what) -> List[int]:
    out = []
    for v in values if isinstance(values, list) else [None]:
        n = v.get("as_int") if isinstance(v, dict) else None
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise _error(where, ErrorCode.BAD_INPUT, f"{what}: expected concrete sizes, found "
                         f"{json.dumps(values)[:120]}")
        out.append(n)
    return out


@dataclasses.dataclass
class Payload:
    """One weight or constant a program expects (from its payload config)."""
    fqn: str
    path_name: str
    is_param: bool
    dtype: torch.dtype
    shape: List[int]
    stride: List[int]
    offset: int


def payloads(config, where) -> List[Payload]:
    """The entries of a ``*_weights_config.json`` / ``*_constants_config.json``,
    refusing pickled ones: tsar never runs a pickle from an archive."""
    items = config.get("config") if isinstance(config, dict) else None
    if not isinstance(items, dict):
        raise _error(where, ErrorCode.BAD_INPUT, "payload config: expected {\"config\": {...}}")
    out = []
    for fqn, meta in items.items():
        w = f"{where}: {fqn!r}"
        if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
            raise _error(w, ErrorCode.BAD_INPUT, "payload entry without a path_name")
        if meta.get("use_pickle") or not isinstance(meta.get("tensor_meta"), dict):
            raise _error(w, ErrorCode.UNSUPPORTED,
                         "stored as a pickle (a tensor subclass, a script object or an opaque "
                         "object): tsar binds plain tensors only and never runs a pickle")
        tm = meta["tensor_meta"]
        off = tm.get("storage_offset", {})
        out.append(Payload(fqn, meta["path_name"], bool(meta.get("is_param")),
                           _dtype(tm.get("dtype"), w), _ints(tm.get("sizes"), w, "sizes"),
                           _ints(tm.get("strides"), w, "strides"),
                           _ints([off], w, "storage_offset")[0]))
    return out


# --- one program -------------------------------------------------------------

@dataclasses.dataclass
class Program:
    """A program read for packing: its stripped bytes and what it binds."""
    name: str
    kind: str
    data: bytes                  # the PT2 zip without weight payloads
    model: str                   # the model's name inside the PT2 ("model")
    weights: List[Payload]       # what it binds from the archive
    torch_version: str
    metadata: Dict[str, str]     # AOTInductor's (platform, CPU ISA), else {}
    dropped: int                 # weight bytes left out


def read(name: str, source) -> Program:
    """Reads ``source`` (an ``ExportedProgram``, a path to a ``.pt2`` that
    ``torch.export.save`` wrote, or to an AOTInductor package that
    :func:`compile_aoti` wrote) for the program ``name``."""
    check_name(name)
    require(f"program {name!r}")
    if isinstance(source, torch.export.ExportedProgram):
        buf = io.BytesIO()
        torch.export.save(source, buf)
        data, where = buf.getvalue(), f"program {name!r}"
    else:
        where = os.fspath(source)
        try:
            with open(where, "rb") as f:
                data = f.read()
        except OSError as e:
            raise _error(where, ErrorCode.IO if os.path.exists(where) else ErrorCode.NOT_FOUND,
                         e.strerror or str(e)) from None
    files = members(data, where)
    if any("/data/aotinductor/" in n for n in files):
        return _read_aoti(name, files, where)
    model_json = _one(files, r"(^|/)models/[^/]+\.json$", where,
                      "exported program (models/NAME.json): is this a torch.export.save file?")
    model = model_json.rsplit("/", 1)[1][:-len(".json")]
    prefix = model_json[:-len(f"models/{model}.json")]
    program = _json(files, model_json, where)
    weights, kept, dropped = _without_weights(
        files, prefix, model, where, ": a PT2 archive from an older torch (weights as one "
        "pickle) is not supported; save it again with torch.export.save")
    # The example inputs are a pickle that torch.export.load would run: left out.
    kept[f"{prefix}data/sample_inputs/{model}.pt"] = b""
    return Program(name, "exported", zip_bytes(kept), model, weights,
                   str(program.get("torch_version") or torch.__version__), {}, dropped)


def _without_weights(files, prefix, model, where, missing_config=""):
    """(the weights a program binds, its members without their payloads, the
    payload bytes left out), refusing pickled weights and constants now
    rather than at load."""
    weights_config = f"{prefix}data/weights/{model}_weights_config.json"
    if weights_config not in files:
        raise _error(where, ErrorCode.BAD_INPUT, f"no {weights_config}{missing_config}")
    weights = payloads(_json(files, weights_config, where), f"{where}: {weights_config}")
    constants_config = f"{prefix}data/constants/{model}_constants_config.json"
    if constants_config in files:
        payloads(_json(files, constants_config, where), f"{where}: {constants_config}")
    kept = {n: b for n, b in files.items() if not _WEIGHT_PAYLOAD.search(n)}
    dropped = sum(len(b) for n, b in files.items() if _WEIGHT_PAYLOAD.search(n))
    return weights, kept, dropped


_TSAR_AOTI = "tsar_aoti.json"  # the member compile_aoti adds: what the package binds


def _read_aoti(name, files, where) -> Program:
    marker = [n for n in files if n.endswith("/" + _TSAR_AOTI) or n == _TSAR_AOTI]
    if len(marker) != 1:
        raise _error(where, ErrorCode.UNSUPPORTED,
                     "an AOTInductor package that tsar.compile_aoti did not write: tsar cannot "
                     "check which weights it binds or whether it inlined some into its code; "
                     "compile the exported program with tsar.compile_aoti(program, path)")
    info = _json(files, marker[0], where)
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise _error(where, ErrorCode.BAD_INPUT, f"{marker[0]}: not {FORMAT}")
    prefix = marker[0][:-len(_TSAR_AOTI)]
    model = info.get("model")
    if not isinstance(model, str) or not _NAME.fullmatch(model):
        raise _error(where, ErrorCode.BAD_INPUT, f"{marker[0]}: bad model name {model!r}")
    weights, kept, dropped = _without_weights(files, prefix, model, where)
    metadata = {k: str(v) for k, v in (info.get("aoti") or {}).items()}
    return Program(name, "aoti", zip_bytes(kept), model, weights,
                   str(info.get("torch_version") or ""), metadata, dropped)


def stamp_of(program: Program, entry: str) -> dict:
    stamp = {
        "format": FORMAT,
        "kind": program.kind,
        "file": file_name(program.name),
        "model": program.model,
        "entry": entry,
        "torch_version": program.torch_version,
        "weights": [[p.fqn, str(p.dtype).replace("torch.", ""), p.shape]
                    for p in program.weights],
    }
    if program.kind == "aoti":
        stamp["platform"] = program.metadata.get("AOTI_PLATFORM", "")
        stamp["machine"] = program.metadata.get("AOTI_MACHINE", "")
        stamp["cpu_isa"] = program.metadata.get("AOTI_CPU_ISA", "")
        stamp["device"] = program.metadata.get("AOTI_DEVICE_KEY", "cpu")
    return stamp


def metadata_items(programs: List[Program], entry: str) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for p in programs:
        out["file:" + file_name(p.name)] = p.data
        out[stamp_key(p.name)] = json.dumps(stamp_of(p, entry), sort_keys=True,
                                            separators=(",", ":"))
    return out


def aliases(weights: List[Payload], keys) -> Dict[str, str]:
    """Tied weights: ``{fqn: fqn it is the same tensor as}`` for each weight
    the entry lacks that the program stores as the same bytes and view as one
    the entry has (export keeps both names of a tied ``lm_head.weight``;
    ``save_pretrained`` stores one)."""
    present = {}
    for p in weights:
        if p.fqn in keys:
            present.setdefault((p.path_name, p.dtype, tuple(p.shape), tuple(p.stride), p.offset),
                               p.fqn)
    out = {}
    for p in weights:
        if p.fqn not in keys:
            same = present.get((p.path_name, p.dtype, tuple(p.shape), tuple(p.stride), p.offset))
            if same is not None:
                out[p.fqn] = same
    return out


def mismatches(weights: List[Payload], archive, entry: str) -> List[str]:
    """What keeps ``weights`` from binding to ``entry``: names it lacks
    (tied names apart), dtypes and shapes that differ."""
    keys = set(archive.keys(entry))
    tied = aliases(weights, keys)
    out = []
    for p in weights:
        if p.fqn in tied:
            continue
        if p.fqn not in keys:
            out.append(f"{p.fqn}: not in entry {entry!r}")
            continue
        info = archive.info(p.fqn, entry)
        if info.dtype != p.dtype:
            out.append(f"{p.fqn}: dtype {str(p.dtype)[6:]} expected, found {str(info.dtype)[6:]}")
        elif list(info.shape) != p.shape:
            out.append(f"{p.fqn}: shape {p.shape} expected, found {list(info.shape)}")
    return out


def check(programs: List[Program], archive, entry: str, where) -> None:
    problems = []
    for p in programs:
        problems += [f"program {p.name!r}: {m}" for m in mismatches(p.weights, archive, entry)]
    if problems:
        raise _error(where, ErrorCode.BIND_MISMATCH,
                     f"{len(problems)} mismatch(es) between the program(s) and the archive's "
                     f"tensors: " + "; ".join(problems[:20])
                     + (f"; and {len(problems) - 20} more" if len(problems) > 20 else ""))


def entry_for(archive, entry: Optional[str], where) -> str:
    entries = list(archive.entries)
    if entry is not None:
        if entry not in entries:
            raise _error(where, ErrorCode.NOT_FOUND, f"no entry {entry!r} (entries: {entries})")
        return entry
    if len(entries) == 1:
        return entries[0]
    if "model" in entries:
        return "model"
    raise _error(where, ErrorCode.INVALID_ARGUMENT,
                 f"{len(entries)} entries {entries}: say which one the programs bind "
                 "(program_entry=)")


def read_all(programs) -> List[Program]:
    if not isinstance(programs, dict):
        raise TypeError("programs: expected a dict {name: ExportedProgram or path to a .pt2}, "
                        f"found {type(programs).__name__}")
    return [read(check_name(n), s) for n, s in programs.items()]


# --- compiling for tsar ------------------------------------------------------

def compile_aoti(program, package_path, *, inductor_configs=None) -> str:
    """Compiles an exported program (an ``ExportedProgram`` or a ``.pt2`` path)
    with AOTInductor into ``package_path``, the way tsar binds it: every
    parameter, buffer and constant outside the shared object
    (``aot_inductor.package_constants_in_so=False``) and none inlined into the
    generated code (``always_keep_tensor_constants=True``: by default inductor
    writes 1-D tensors of up to 8 elements into the code, where no archive
    could change them). The package also gets the program's payload configs
    (names, dtypes, shapes: no weight bytes), its non-weight constants
    (buffers that are not in the state_dict, such as rotary frequencies: small)
    and ``tsar_aoti.json``, which ``tsar.pack(..., programs=)`` reads to check
    it against the archive. Compiling takes tens of seconds to minutes.
    Returns ``package_path``."""
    require(os.fspath(package_path))
    require(os.fspath(package_path), aoti=True)
    if not isinstance(program, torch.export.ExportedProgram):
        program = torch.export.load(os.fspath(program))
    from torch._inductor import aoti_compile_and_package

    configs = {"aot_inductor.package_constants_in_so": False,
               "always_keep_tensor_constants": True}
    configs.update(inductor_configs or {})
    package_path = os.fspath(package_path)
    directory = os.path.dirname(os.path.abspath(package_path))
    import tempfile

    fd, raw = tempfile.mkstemp(prefix=".tsar-aoti-", suffix=".pt2", dir=directory)
    os.close(fd)
    try:
        aoti_compile_and_package(program, package_path=raw, inductor_configs=configs)
        with open(raw, "rb") as f:
            compiled = _under(members(f.read(), raw), "package/", raw)
        buf = io.BytesIO()
        torch.export.save(program, buf)
        exported = _under(members(buf.getvalue(), "the exported program"), "package/", "exported")
        # The exported program's payload configs (no weight bytes) and its
        # constants (small): what the package binds, and what it binds to
        # besides the archive.
        model = "model"
        for n, b in exported.items():
            if n == f"package/data/weights/{model}_weights_config.json" or \
                    n.startswith("package/data/constants/"):
                compiled[n] = b
        for n in compiled:
            # inductor appends its compile and link commands (with temporary
            # paths) to the sources it keeps, once per compile that hits its
            # cache: cut, so that one program gives one package.
            if n.endswith(".cpp") and b"\n// Compile cmd" in compiled[n]:
                compiled[n] = compiled[n][:compiled[n].index(b"\n// Compile cmd") + 1]
        aoti = {}
        for n in sorted(compiled):
            if n.startswith(f"package/data/aotinductor/{model}/") and n.endswith("_metadata.json"):
                try:
                    aoti.update(json.loads(compiled[n]))
                except ValueError:
                    pass
        compiled["package/" + _TSAR_AOTI] = json.dumps(
            {"format": FORMAT, "model": model, "torch_version": torch.__version__, "aoti": aoti},
            sort_keys=True).encode()
        with open(raw, "wb") as f:
            f.write(zip_bytes(compiled))
        os.replace(raw, package_path)
    finally:
        if os.path.exists(raw):
            os.unlink(raw)
    return package_path
