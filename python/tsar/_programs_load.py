"""Loading a program stored in an archive (issue 60; the convention is
:mod:`tsar._programs`'s): :func:`load_program` gives the exported program's
module with every weight and buffer a view of the archive's mapping,
:func:`load_aoti` an AOTInductor model whose constants are the mapped
tensors (``user_managed``: not copied). Neither imports anything but torch.

What runs: tsar reads the program's graph (JSON) through torch's own
deserializer, with the example inputs left out and the guard code torch would
``exec`` left out (both are code or pickles from the file); pickled weights
and constants are refused. An AOTInductor program is native code: it is
loaded only by the explicit call :func:`load_aoti`.
"""
from __future__ import annotations

import json
import os
import platform
import re
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import torch

from ._errors import ErrorCode
from . import _programs as P


_error = P._error


def _open(path_or_archive):
    from ._archive import Archive, open as tsar_open

    if isinstance(path_or_archive, Archive):
        return path_or_archive
    return tsar_open(path_or_archive)


def names(archive, metadata=None) -> List[str]:
    """The programs an archive holds (the names of its ``program:`` stamps)."""
    return sorted(k[len(P.STAMP_PREFIX):] for k in (metadata or archive.metadata())
                  if k.startswith(P.STAMP_PREFIX))


def _release(version: str) -> Tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else ()


def _stamp(archive, name: Optional[str], kind: str, torch_match: str):
    where = archive.path
    if torch_match not in P.TORCH_MATCHES:
        raise _error(where, ErrorCode.INVALID_ARGUMENT,
                     f"torch_match={torch_match!r}: expected one of {P.TORCH_MATCHES}")
    metadata = archive.metadata()  # read once: it holds every attached file's bytes
    held = names(archive, metadata)
    if name is None:
        of_kind = [n for n in held if _kind_of(metadata, n) == kind]
        if len(of_kind) != 1:
            raise _error(where, ErrorCode.NOT_FOUND if not of_kind else ErrorCode.INVALID_ARGUMENT,
                         f"{len(of_kind)} {kind} program(s) in the archive"
                         + (f" ({', '.join(of_kind)}): say which (name=)" if of_kind else
                            f"; programs: {held or 'none'} (tsar.pack(..., programs=) adds one)"))
        name = of_kind[0]
    where = f"{archive.path}: program {name!r}"
    raw = metadata.get(P.stamp_key(name))
    if raw is None:
        raise _error(where, ErrorCode.NOT_FOUND, f"not in the archive (programs: {held or 'none'})")
    try:
        stamp = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise _error(where, ErrorCode.BAD_INPUT, f"stamp {P.stamp_key(name)!r}: not JSON ({e})") from None
    if not isinstance(stamp, dict) or stamp.get("format") != P.FORMAT:
        raise _error(where, ErrorCode.UNSUPPORTED,
                     f"stamp format {stamp.get('format') if isinstance(stamp, dict) else stamp!r}: "
                     f"this tsar reads {P.FORMAT}")
    if stamp.get("kind") != kind:
        other = {"exported": "tsar.load_program", "aoti": "tsar.load_aoti"}.get(stamp.get("kind"))
        raise _error(where, ErrorCode.INVALID_ARGUMENT,
                     f"a {stamp.get('kind')!r} program, not {kind!r}"
                     + (f": load it with {other}" if other else ""))
    if stamp.get("file") != P.file_name(name) or not isinstance(stamp.get("entry"), str) \
            or not isinstance(stamp.get("model"), str) or not P._NAME.fullmatch(stamp["model"]):
        raise _error(where, ErrorCode.BAD_INPUT, "stamp: file, entry or model malformed")
    if stamp["entry"] not in archive.entries:
        raise _error(where, ErrorCode.BAD_INPUT, f"binds entry {stamp['entry']!r}, which the "
                     f"archive lacks (entries: {list(archive.entries)})")
    made, here = str(stamp.get("torch_version", "")), torch.__version__
    if torch_match != "any":
        if kind == "aoti":
            ok = (_release(made) == _release(here)) if torch_match == "release" else \
                made.split("+")[0] == here.split("+")[0]
            need = f"torch {'.'.join(map(str, _release(made)))}.x" if torch_match == "release" else made
        else:  # torch's deserializer reads older programs: the same or a newer torch
            ok = _release(here) >= _release(made) if torch_match == "release" else \
                made.split("+")[0] == here.split("+")[0]
            need = f"torch {'.'.join(map(str, _release(made)))} or newer" \
                if torch_match == "release" else made
        if not ok:
            raise _error(where, ErrorCode.UNSUPPORTED,
                         f"made with torch {made}, needs {need}; this is torch {here} "
                         "(torch_match='any' tries anyway)")
    data = metadata.get("file:" + P.file_name(name))
    if not isinstance(data, bytes):
        raise _error(where, ErrorCode.BAD_INPUT, f"stamp without its file {P.file_name(name)!r}")
    return name, where, stamp, data, P.members(data, f"{where}: {P.file_name(name)}")


def _kind_of(metadata, name) -> Optional[str]:
    try:
        return json.loads(metadata.get(P.stamp_key(name), "")).get("kind")
    except (TypeError, ValueError, AttributeError):
        return None


def _prefix(files, model, where, marker) -> str:
    found = [n[:-len(marker)] for n in files if n.endswith(marker) and
             (n == marker or n[:-len(marker)].endswith("/"))]
    if len(found) != 1:
        raise _error(where, ErrorCode.BAD_INPUT, f"expected one {marker}, found {len(found)}")
    return found[0]


def _weights(archive, entry, files, prefix, model, where) -> Tuple[List[P.Payload], Dict[str, torch.Tensor]]:
    config = f"{prefix}data/weights/{model}_weights_config.json"
    if config not in files:
        raise _error(where, ErrorCode.BAD_INPUT, f"no {config}")
    weights = P.payloads(P._json(files, config, where), f"{where}: {config}")
    problems = P.mismatches(weights, archive, entry)
    if problems:
        raise _error(where, ErrorCode.BIND_MISMATCH,
                     f"{len(problems)} weight(s) do not match entry {entry!r}: "
                     + "; ".join(problems[:20]))
    tied = P.aliases(weights, set(archive.keys(entry)))
    tensors = {p.fqn: archive.tensor(p.fqn, entry) for p in weights if p.fqn not in tied}
    tensors.update({fqn: tensors[same] for fqn, same in tied.items()})
    return weights, tensors


def _constants(files, prefix, model, where) -> Dict[str, torch.Tensor]:
    """The program's own constants (buffers outside the state_dict, lifted
    tensors): small, stored in the program, private copies."""
    config = f"{prefix}data/constants/{model}_constants_config.json"
    if config not in files:
        return {}
    out = {}
    for p in P.payloads(P._json(files, config, where), f"{where}: {config}"):
        w = f"{where}: constant {p.fqn!r}"
        raw = files.get(f"{prefix}data/constants/{p.path_name}")
        if raw is None or "/" in p.path_name:
            raise _error(w, ErrorCode.BAD_INPUT, f"payload {p.path_name!r} missing")
        size = torch.empty((), dtype=p.dtype).element_size()
        if len(raw) % size:
            raise _error(w, ErrorCode.BAD_INPUT, f"{len(raw)} bytes, not a whole number of {p.dtype}")
        n = len(raw) // size
        if len(p.shape) != len(p.stride):
            raise _error(w, ErrorCode.BAD_INPUT, "sizes and strides differ in length")
        if all(s > 0 for s in p.shape):
            last = p.offset + sum((s - 1) * st for s, st in zip(p.shape, p.stride))
            if last >= n:
                raise _error(w, ErrorCode.BAD_INPUT,
                             f"shape {p.shape} strides {p.stride} offset {p.offset} reach element "
                             f"{last}, past the payload's {n}")
        flat = torch.frombuffer(bytearray(raw), dtype=p.dtype) if n else torch.empty(0, dtype=p.dtype)
        out[p.fqn] = flat.as_strided(p.shape, p.stride, p.offset)
    return out


def load_program(path_or_archive, name: Optional[str] = None, *, torch_match: str = "release"):
    """The exported program ``name`` (the archive's only one by default) as a
    runnable module, ``ExportedProgram.module()``, whose parameters and buffers
    are the archive's tensors, views of its mapping (zero copy; read-only in
    the default ``mode="shared"``: call it under ``torch.no_grad()`` or
    ``torch.inference_mode()``). Only torch is imported: a program exported
    from a transformers model runs without transformers.

    ``torch_match``: ``"release"`` (default) loads a program made with the
    same or an older torch release (torch's deserializer reads older
    programs); ``"exact"`` needs the same version; ``"any"`` tries anyway.

    Raises tsar.Error: NOT_FOUND (no such program), UNSUPPORTED (torch
    version, pickled weights), BIND_MISMATCH (a weight the entry lacks or with
    another dtype or shape), BAD_INPUT (a malformed program), naming the
    archive and the program.
    """
    archive = _open(path_or_archive)
    P.require(archive.path)
    name, where, stamp, _, files = _stamp(archive, name, "exported", torch_match)
    model = stamp["model"]
    prefix = _prefix(files, model, where, f"models/{model}.json")
    weights, tensors = _weights(archive, stamp["entry"], files, prefix, model, where)
    # One Parameter per tensor: tied names stay one object in the module.
    made = {}
    state_dict = {}
    for p in weights:
        t = tensors[p.fqn]
        if p.is_param:
            t = made.setdefault(id(t), torch.nn.Parameter(t, requires_grad=False))
        state_dict[p.fqn] = t
    constants = _constants(files, prefix, model, where)

    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _bytes_to_dataclass

    try:
        serialized = _bytes_to_dataclass(schema.ExportedProgram, files[f"{prefix}models/{model}.json"])
    except Exception as e:  # noqa: BLE001  (torch raises many kinds on a bad schema)
        raise _error(where, ErrorCode.BAD_INPUT, f"models/{model}.json: {type(e).__name__}: {e}") from None
    if getattr(serialized, "guards_code", None):
        # Python source that ep.module() would exec: never run code from an archive.
        serialized.guards_code = []
    try:
        ep = ExportedProgramDeserializer(None).deserialize(serialized, state_dict, constants, b"")
        module = ep.module()
    except Exception as e:  # noqa: BLE001
        raise _error(where, ErrorCode.BAD_INPUT,
                     f"torch {torch.__version__} cannot rebuild it: {type(e).__name__}: {e}") from None
    _check_bound(module, tensors, where)
    module._tsar_archive = archive  # the mapping lives as long as the module
    return module


def _check_bound(module, tensors, where) -> None:
    """Every weight of ``module`` that the program binds is the mapped tensor."""
    held = dict(module.named_parameters(remove_duplicate=False))
    held.update(module.named_buffers(remove_duplicate=False))
    copied = [fqn for fqn, t in tensors.items()
              if fqn in held and held[fqn].data_ptr() != t.data_ptr()]
    if copied:
        raise _error(where, ErrorCode.UNSUPPORTED,
                     f"torch {torch.__version__} copied {len(copied)} weight(s) while building "
                     f"the module ({', '.join(copied[:5])}): not bound zero copy")


# --- AOTInductor ---------------------------------------------------------------

_ISA_FLAGS = {  # AOTI_CPU_ISA words -> /proc/cpuinfo flags (x86)
    "AVX2": ("avx2", "fma"),
    "AVX512": ("avx512f", "avx512dq", "avx512vl", "avx512bw"),
    "AVX512_VNNI": ("avx512_vnni",),
    "AVX512_BF16": ("avx512_bf16",),
    "AVX512_FP16": ("avx512_fp16",),
    "AMX_TILE": ("amx_tile",),
    "AMX_BF16": ("amx_bf16",),
    "AMX_INT8": ("amx_int8",),
}


def cpu_flags() -> Optional[set]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def check_machine(stamp, where) -> None:
    """The platform, machine and CPU ISA an AOTInductor program was compiled
    for, against this one's."""
    plat, machine = stamp.get("platform", ""), stamp.get("machine", "")
    if plat and plat != sys.platform:
        raise _error(where, ErrorCode.UNSUPPORTED, f"compiled for {plat}, this is {sys.platform}")
    if machine and machine != platform.machine():
        raise _error(where, ErrorCode.UNSUPPORTED,
                     f"compiled for {machine}, this is {platform.machine()}")
    if stamp.get("device", "cpu") != "cpu":
        raise _error(where, ErrorCode.UNSUPPORTED,
                     f"compiled for {stamp.get('device')}: tsar binds CPU AOTInductor programs")
    flags = cpu_flags()
    if flags is None or machine not in ("x86_64", ""):
        return
    missing = [w for w in str(stamp.get("cpu_isa", "")).split()
               if any(f not in flags for f in _ISA_FLAGS.get(w, ()))]
    if missing:
        raise _error(where, ErrorCode.UNSUPPORTED,
                     f"compiled for the CPU ISA {stamp.get('cpu_isa')!r}; this CPU lacks "
                     f"{', '.join(missing)}: compile it again on (or for) this machine")


class AotiModel:
    """An AOTInductor model: what torch's ``AOTICompiledModel`` is (the same
    calls: ``__call__``, ``load_constants``, ``get_constant_fqns``,
    ``get_metadata``, ``loader``), made over LibTorch's loader directly, so
    that a process that only runs it does not import torch's Python
    AOTInductor and export modules (a second and more of its start).

    After :func:`load_aoti`: ``bound`` maps each constant bound to the
    archive to its tensor (a view of the mapping, zero copy);
    ``private_constant_bytes`` counts the program's own constants (private
    copies: rotary frequencies and the like); ``archive`` is the archive."""

    archive = None
    bound: dict = {}
    private_constant_bytes = 0

    def __init__(self, loader):
        self.loader = loader
        import torch.utils._pytree as pytree

        self._pytree = pytree
        in_spec, out_spec = loader.get_call_spec()
        self._in = pytree.treespec_loads(in_spec)
        self._out = pytree.treespec_loads(out_spec)

    def __call__(self, *args, **kwargs):
        if kwargs:  # in the order the program was exported with, as torch orders them
            from torch.export._tree_utils import reorder_kwargs

            kwargs = reorder_kwargs(kwargs, self._in)
        flat = [x for x in self._pytree.tree_flatten((args, kwargs))[0]
                if isinstance(x, torch.Tensor)]
        return self._pytree.tree_unflatten(self.loader.boxed_run(flat), self._out)

    def load_constants(self, constants_map, *, check_full_update: bool, user_managed: bool = False):
        self.loader.load_constants(constants_map, False, check_full_update, user_managed)

    def get_constant_fqns(self):
        return self.loader.get_constant_fqns()

    def get_metadata(self):
        return self.loader.get_metadata()


def load_aoti(path_or_archive, name: Optional[str] = None, *, torch_match: str = "release"):
    """The AOTInductor program ``name`` (the archive's only one by default),
    loaded with LibTorch's package loader and given the archive's tensors
    as its constants, ``user_managed``: the compiled code reads the mapping,
    no copy (the program's own small constants, such as rotary frequencies,
    are private copies). Returns an :class:`AotiModel`, which is called as
    torch's ``AOTICompiledModel`` is (the inputs it was exported with; its
    outputs as the exported module returned them).

    This loads native code from the archive (the compiled shared object):
    call it on archives you trust. Checked first: the torch release it was
    compiled with (``torch_match``: ``"release"``, the default, needs the same
    major.minor; ``"exact"``; ``"any"``), the platform, machine and CPU ISA
    (a package compiled for AVX-512 refuses a CPU without it), and every
    weight's name, dtype and shape against the archive.
    """
    archive = _open(path_or_archive)
    P.require(archive.path, aoti=True)
    name, where, stamp, package, files = _stamp(archive, name, "aoti", torch_match)
    check_machine(stamp, where)
    model = stamp["model"]
    prefix = _prefix(files, model, where, P._TSAR_AOTI)
    weights, tensors = _weights(archive, stamp["entry"], files, prefix, model, where)
    constants = _constants(files, prefix, model, where)
    fd, tmp = tempfile.mkstemp(prefix="tsar-aoti-", suffix=".pt2")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(package)
        try:  # LibTorch's loader extracts the package; the file can go after
            compiled = AotiModel(torch._C._aoti.AOTIModelPackageLoader(tmp, model))
        except Exception as e:  # noqa: BLE001
            raise _error(where, ErrorCode.BAD_INPUT,
                         f"torch {torch.__version__} cannot load the package: {e}") from None
    finally:
        os.unlink(tmp)
    wanted = list(compiled.get_constant_fqns())
    given = {**constants, **tensors}
    missing = [fqn for fqn in wanted if fqn not in given]
    if missing:
        raise _error(where, ErrorCode.BIND_MISMATCH,
                     f"the compiled code needs {len(missing)} constant(s) that neither the archive "
                     f"nor the program holds: {', '.join(missing[:10])}")
    compiled.load_constants({fqn: given[fqn] for fqn in wanted}, check_full_update=True,
                            user_managed=True)
    compiled.archive = archive
    compiled.bound = {fqn: tensors[fqn] for fqn in wanted if fqn in tensors}
    compiled.private_constant_bytes = sum(
        t.untyped_storage().nbytes() for fqn, t in constants.items() if fqn in wanted)
    return compiled
