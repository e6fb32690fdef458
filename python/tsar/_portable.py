"""The portable path: tsar over any torch 2.x, with no LibTorch of its own.

``tsar._tsar_portable`` (python/src/portable.cc) links no LibTorch: it opens,
validates and maps an archive and hands out each storage's bytes as a buffer.
Here those bytes become tensors through torch's public Python API, which every
torch of the supported range has: one ``torch.frombuffer`` per storage (tensors
that shared a storage when saved share it again), then one ``as_strided`` view
per tensor. ``load_into`` binds in place with ``tensor.data = view``: the same
Parameter object, a meta tensor becoming a CPU tensor (torch's ``set_data``
takes the new data's device).

tsar/__init__.py uses this path when the accelerator (``tsar._tsar``, built
against one torch) does not match the torch imported, or when the environment
variable TSAR_PORTABLE=1 asks for it. What it does not do raises tsar.Error
(UNSUPPORTED) saying so: writing archives, loading onto a GPU, read-ahead and
sparse tensors need the accelerator. A tensor-parallel rank's slice of a
sharded tensor is a view of the whole tensor in C order (a copy the archive
makes once), not of the rank's own run of the file.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from . import _tsar_portable
from ._errors import Error, ErrorCode

_DTYPES: Dict[str, torch.dtype] = {}


def _dtype(name: str, path: str) -> torch.dtype:
    """torch's dtype named ``name`` (the format's names are torch's:
    "bfloat16", "float8_e4m3fn"); UNSUPPORTED where this torch lacks it."""
    d = _DTYPES.get(name)
    if d is None:
        d = getattr(torch, name, None)
        if not isinstance(d, torch.dtype):
            raise Error(f"{path}: dtype {name} is not supported by this torch ({torch.__version__})",
                        ErrorCode.UNSUPPORTED, path)
        _DTYPES[name] = d
    return d


def unsupported(path: str, what: str) -> Error:
    from . import _backend

    return Error(f"{path}: {what} needs tsar's accelerator, and this process runs the portable "
                 f"path ({_backend.describe()}): {_backend.advice()}", ErrorCode.UNSUPPORTED, path)


class PortableArchive:
    """What tsar.Archive asks of its implementation (the accelerator's
    ``_tsar.Archive``), over ``_tsar_portable.ArchiveFile``. Thread-safe for
    reading: the caches only ever gain an entry equal to any other thread's."""

    def __init__(self, file):
        self._file = file
        self._bytes: Dict[int, torch.Tensor] = {}  # storage -> uint8 tensor over its bytes
        self._typed: Dict[Tuple[int, torch.dtype], torch.Tensor] = {}
        self._tables: Dict[str, Tuple[List[tuple], Dict[str, tuple]]] = {}

    # -- what the file says ------------------------------------------------------
    path = property(lambda self: self._file.path)
    mode = property(lambda self: self._file.mode)
    format_version = property(lambda self: self._file.format_version)
    alignment = property(lambda self: self._file.alignment)
    layers = property(lambda self: self._file.layers)
    file_size = property(lambda self: self._file.file_size)
    tp_world = property(lambda self: self._file.tp_world)
    data_ptr = property(lambda self: self._file.data_ptr)
    mapped_size = property(lambda self: self._file.mapped_size)

    def entries(self):
        return self._file.entries()

    def names(self, entry):
        return self._file.names(entry)

    def contains(self, name, entry):
        return self._file.contains(name, entry)

    def metadata_items(self, entry):
        return self._file.metadata_items(entry)

    def verify(self):
        self._file.verify()

    def damaged(self):
        return self._file.damaged()

    def info(self, name, entry):
        return self._with_dtype(self._file.info(name, entry))

    def infos(self):
        return [self._with_dtype(i) for i in self._file.infos()]

    def _with_dtype(self, i):
        return (i[0], i[1], _dtype(i[2], self.path)) + tuple(i[3:])

    # -- tensors -----------------------------------------------------------------
    def table(self, entry: str):
        """(infos in file order, {name: info}) of ``entry``: one call into the
        extension per entry, kept while the archive is open."""
        t = self._tables.get(entry)
        if t is None:
            infos = self._file.entry_infos(entry)
            t = (infos, {i[0]: i for i in infos})
            self._tables[entry] = t
        return t

    def _storage(self, index: int, dtype: torch.dtype) -> torch.Tensor:
        """Storage ``index`` as a 1-d tensor of ``dtype`` over all its bytes."""
        typed = self._typed.get((index, dtype))
        if typed is not None:
            return typed
        raw = self._bytes.get(index)
        if raw is None:
            b = self._file.storage_bytes(index)
            # frombuffer refuses an empty buffer; an empty storage holds no view's bytes.
            raw = torch.frombuffer(b, dtype=torch.uint8) if b.nbytes else torch.empty(0, dtype=torch.uint8)
            self._bytes[index] = raw
        item = torch.empty((), dtype=dtype).element_size()
        # A storage whose size is no multiple of the element size (bytes shared
        # by tensors of several dtypes): its whole elements.
        whole = raw.numel() - raw.numel() % item
        typed = (raw[:whole] if whole != raw.numel() else raw).view(dtype)
        self._typed[(index, dtype)] = typed
        return typed

    def view(self, info) -> torch.Tensor:
        """The view of the mapping that tensor ``info`` is (no requires_grad)."""
        _, _, dtype_name, sizes, strides, offset, storage, _, _, _ = info
        return self._storage(storage, _dtype(dtype_name, self.path)).as_strided(sizes, strides, offset)

    def make(self, info) -> torch.Tensor:
        t = self.view(info)
        if info[8]:  # requires_grad, as saved
            t.requires_grad_(True)
        return t

    def _visible(self, info, entry):
        if info[1] is None:  # (name, None): a sparse tensor
            raise unsupported(self.path, f"sparse tensor {info[0]!r} of entry {entry!r}")
        return info

    def tensor(self, name, entry):
        infos, by_name = self.table(entry)
        info = by_name.get(name)
        if info is None:
            self._file.info(name, entry)  # raises NOT_FOUND naming the entry
        return self.make(self._visible(info, entry))

    def state_dict(self, entry):
        infos, _ = self.table(entry)
        return [(i[0], self.make(self._visible(i, entry))) for i in infos]

    def shard(self, name, rank, world, dim, entry):
        info = self.info(name, entry)
        if dim is None:
            dim = info[9]
            if dim < 0:
                raise Error(f"{self.path}: shard: {name!r} is stored whole: name the dim to split",
                            ErrorCode.INVALID_ARGUMENT, self.path)
        t = self.tensor(name, entry)
        if not (isinstance(world, int) and world >= 1 and 0 <= rank < world):
            raise Error(f"{self.path}: shard: expected 0 <= rank < world, found rank {rank}, "
                        f"world {world}", ErrorCode.INVALID_ARGUMENT, self.path)
        if not -t.dim() <= dim < t.dim():
            raise Error(f"{self.path}: shard: dim {dim} of a {t.dim()}-d tensor",
                        ErrorCode.INVALID_ARGUMENT, self.path)
        return _chunk(t, world, dim % t.dim(), rank)

    def to_device(self, *args):
        raise unsupported(self.path, "state_dict(device=) onto a GPU")


def _chunk_size(n: int, rank: int, world: int) -> int:
    """Rank ``rank``'s part of ``n`` split ``world`` ways, as torch.chunk gives it."""
    c = -(-n // world)
    if c == 0 or rank * c >= n:
        return 0
    return min(c, n - rank * c)


def _chunk(t: torch.Tensor, world: int, dim: int, rank: int) -> torch.Tensor:
    c = -(-t.shape[dim] // world)
    size = _chunk_size(t.shape[dim], rank, world)
    return t.narrow(dim, min(rank * c, t.shape[dim]), size)


def open_file(path, mode, prefetch, verify, base_dirs) -> PortableArchive:
    return PortableArchive(_tsar_portable.open(path, mode, prefetch, verify, base_dirs))
