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
variable TSAR_PORTABLE=1 asks for it. ``tsar.save`` works too
(tsar/_portable_save.py: the same writer, the same bytes), and ``tsar.pack``
(tsar._tsar_pack_portable: the `tsar` command's readers). load_into runs in
C++ where it can (python/src/portable_bind.h), tsar/_portable_bind.py
otherwise. ``state_dict(device=)`` and ``load_into(device=)`` copy onto a GPU
through the accelerator's staging pipeline (tsar/_portable_device.py).
TorchScript inputs to tsar.pack and its arch= go through this torch's
torch.jit (tsar/_portable_torchscript.py), sparse tensors through their
components (tsar/_portable_save.py). In a tensor-parallel archive a rank's
slice of a sharded tensor is a view of the rank's own run of the file, as on
the accelerator (PortableArchive.slice).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from . import _tsar_portable
from ._errors import Error, ErrorCode
from ._portable_dtypes import DTYPES, as_dtype, torch_dtype

class PortableArchive:
    """What tsar.Archive asks of its implementation (the accelerator's
    ``_tsar.Archive``), over ``_tsar_portable.ArchiveFile``. Thread-safe for
    reading: the caches only gain entries, the first one made for a storage
    wins (dict.setdefault under the GIL), so its tensors share one storage
    whichever thread made them."""

    def __init__(self, file):
        self._file = file
        # storage -> a tensor over all its bytes: a 1-d one (the dtype of its
        # first view), or the one tensor that is all of it (state_dict() in
        # C++, python/src/portable_bind.h); views are as_strided of it
        self._first: Dict[int, torch.Tensor] = {}
        self._typed: Dict[Tuple[int, torch.dtype], torch.Tensor] = {}  # its other dtypes
        self._tables: Dict[str, Tuple[List[tuple], Dict[str, tuple]]] = {}
        # sharded storage -> (its bytes as the file holds them, as a 1-d
        # tensor of its tensors' dtype (R110: one dtype), block_stride)
        self._blocked: Dict[int, Tuple[torch.Tensor, int]] = {}

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

    def groups(self, entry):
        return self._file.groups(entry)

    def bind_entry(self, entry):
        return self._file.bind_entry(entry)

    def metadata_items(self, entry):
        return self._file.metadata_items(entry)

    def metadata_keys(self, entry):
        return self._file.metadata_keys(entry)

    def metadata_value(self, key, entry):
        return self._file.metadata_value(key, entry)

    def verify(self):
        self._file.verify()

    def damaged(self):
        return self._file.damaged()

    def info(self, name, entry):
        return self._with_dtype(self._file.info(name, entry))

    def infos(self):
        return [self._with_dtype(i) for i in self._file.infos()]

    def _with_dtype(self, i):
        return (i[0], i[1], torch_dtype(i[2], self.path)) + tuple(i[3:])

    # -- tensors -----------------------------------------------------------------
    # A row of an entry's table (python/src/portable.cc, entry_table): (name,
    # dtype, sizes, strides, storage_offset, storage, requires_grad, shard_dim),
    # or (name, None) for a sparse tensor.
    def table(self, entry: str):
        """(rows in file order, {name: row}) of ``entry``: one call into the
        extension per entry, kept while the archive is open."""
        t = self._tables.get(entry)
        if t is None:
            rows = self._file.entry_table(entry, DTYPES)
            by_name = {r[0]: r for r in rows}
            for r in rows:  # a group's members, by their own names (tensors of the table)
                if r[1] is None and r[2] == _GROUP:
                    by_name.update((c[0], c) for c in r[5])
            t = (rows, by_name)
            self._tables[entry] = t
        return t

    def _flat(self, storage: int, dtype: torch.dtype) -> torch.Tensor:
        """Storage ``storage`` as a 1-d tensor of ``dtype``: one torch storage
        per archive storage, whatever the dtypes its tensors view it as."""
        first = self._first.get(storage)
        if first is None:
            b = self._file.storage_bytes(storage)
            n, item = b.nbytes, dtype.itemsize
            if n == 0:  # frombuffer refuses an empty buffer; no view reads it
                first = torch.empty(0, dtype=dtype)
            elif n % item == 0:
                first = torch.frombuffer(b, dtype=dtype)
            else:  # bytes shared by tensors of several dtypes: whole elements below
                first = torch.frombuffer(b, dtype=torch.uint8)
            # setdefault: two threads making the same storage at once use the
            # first one's, so its tensors still share one torch storage.
            first = self._first.setdefault(storage, first)
            if first.dtype == dtype:
                return first
        # All the storage's bytes, whatever the shape of the tensor kept.
        raw = first.as_strided((first.untyped_storage().nbytes() // first.element_size(),), (1,),
                               0).view(torch.uint8)
        return self._typed.setdefault((storage, dtype), as_dtype(raw, dtype))

    def bind_api(self, plain_cache, plain) -> tuple:
        """What ``_tsar_portable.bind_fast`` calls into torch with
        (python/src/portable_bind.h). Made per bind, not kept: kept, its
        view_of would hold this archive in a reference cycle, and the mapping
        would outlive close() until the next garbage collection (a hot-swapping
        server's old versions stayed mapped)."""
        return (torch.Tensor, DTYPES, torch.strided, torch._C._from_dlpack,
                torch._C._swap_tensor_impl, torch.Tensor._make_subclass, self._view_of,
                plain_cache, plain, self._first)

    def _view_of(self, entry: str, name: str) -> torch.Tensor:
        return self.view(_row_of(self._file.info(name, entry)))

    def view(self, row) -> torch.Tensor:
        """The view of the mapping that tensor ``row`` is (no requires_grad)."""
        if row[1] is None:
            return self._sparse(row)
        name, dtype, sizes, strides, offset, storage = row[:6]
        if type(dtype) is str:
            torch_dtype(dtype, self.path)  # raises UNSUPPORTED
        flat = self._first.get(storage)
        if flat is None or flat.dtype is not dtype:
            flat = self._typed.get((storage, dtype))
            if flat is None:
                flat = self._flat(storage, dtype)
        return flat.as_strided(sizes, strides, offset)

    def _sparse(self, row) -> torch.Tensor:
        """A sparse tensor (spec §4.6) over views of its components, its index
        values checked by torch (INVALID_VALUE where they are out of range),
        as the accelerator's (loader/sparse.cc)."""
        name, _, layout, sizes, coalesced, components = row
        if layout == _GROUP:
            raise Error(f'{self.path}: tensor "{name}" is a tensor group (spec §4.13): '
                        "tsar.Archive rebuilds it from its members", ErrorCode.UNSUPPORTED,
                        self.path)
        c = [self.view(r) for r in components]
        values = c[-1]

        def fail(why):
            return Error(f'{self.path}: sparse tensor "{name}": {why}', ErrorCode.INVALID_VALUE,
                         self.path)

        if layout == _COO:
            if (len(c) != 2 or c[0].dtype != torch.int64 or c[0].dim() != 2 or values.dim() < 1
                    or c[0].shape[1] != values.shape[0]
                    or c[0].shape[0] + values.dim() - 1 != len(sizes)):
                raise fail("expected int64 indices [sparse_dim, nnz] and values [nnz, dense "
                           "sizes...] matching the sizes")
        elif (len(c) != 3 or len(sizes) < 2 or c[0].dim() != 1 or c[1].dim() != 1
              or c[0].dtype != c[1].dtype or c[0].dtype not in (torch.int64, torch.int32)
              or values.dim() != 1 or c[1].shape[0] != values.shape[0]):
            raise fail("expected compressed and plain int32/int64 indices and 1-d values of equal "
                       "length")
        try:
            if layout == _COO:
                t = torch.sparse_coo_tensor(c[0], values, sizes, check_invariants=True)
                return t._coalesced_(True) if coalesced else t
            make = torch.sparse_csr_tensor if layout == _CSR else torch.sparse_csc_tensor
            return make(c[0], c[1], values, sizes, check_invariants=True)
        except RuntimeError as e:
            raise fail(str(e).split("\n")[0]) from None

    def make(self, row) -> torch.Tensor:
        t = self.view(row)
        if row[1] is not None and row[6]:  # requires_grad, as saved
            t.requires_grad_(True)
        return t

    def tensor(self, name, entry):
        row = self.table(entry)[1].get(name)
        if row is None:  # a sparse tensor's component ("adj.indices"), or NOT_FOUND raised
            row = _row_of(self._file.info(name, entry))
        return self.make(row)

    def state_dict(self, entry):
        """[(name, tensor)] in file order: view()'s tensors, made in C++
        where it can (python/src/portable_bind.h: a storage's flat tensor
        through DLPack, kept in _first as _flat keeps it, then as_strided),
        the others by make()."""
        rows, _ = self.table(entry)
        fast = self._file.dlpack_tensors(entry, torch._C._from_dlpack, self._first, DTYPES)
        out = []
        for r, t in zip(rows, fast):
            if r[1] is None and r[2] == _GROUP:  # its members, as the accelerator's
                out.extend((c[0], self.make(c)) for c in r[5])
                continue
            if t is None:
                t = self.make(r)
            elif r[6]:  # requires_grad, as saved
                t.requires_grad_(True)
            out.append((r[0], t))
        return out

    def shard(self, name, rank, world, dim, entry):
        """torch.chunk(full, world, dim)[rank], with the accelerator's checks
        and messages (loader/shards.cc): of a sharded tensor, the rank's block
        (or a copy of the blocks the slice spans, _slice); of a whole one, a
        view."""
        info = self._file.info(name, entry)  # NOT_FOUND naming the entry
        qualified = f"{info[1]}/{info[0]}"

        def fail(why):
            return Error(f'{self.path}: shard of "{qualified}": {why}', ErrorCode.INVALID_ARGUMENT,
                         self.path)

        if world < 1:
            raise fail(f"world: expected at least 1, found {world}")
        if not 0 <= rank < world:
            raise fail(f"rank: expected 0 to {world - 1}, found {rank}")
        ndim = len(info[3])
        if dim is None:
            if info[9] < 0:
                raise fail("dim: the archive stores this tensor whole, so say which dimension to "
                           "split")
            dim = info[9]
        if ndim == 0:
            raise fail("a scalar (0 dimensions) has no dimension to split")
        if not -ndim <= dim < ndim:
            raise fail(f"dim: expected -{ndim} to {ndim - 1}, found {dim}")
        dim %= ndim
        size = info[3][dim]
        if size > 0:
            chunks = -(-size // -(-size // world))
            if rank >= chunks:
                raise fail(f"rank {rank}: size {size} of dim {dim} gives only {chunks} chunks of "
                           f"{world}")
        out = self.slice(_row_of(info), info[1], rank, world, dim)
        if info[8]:
            out.requires_grad_(True)
        return out

    def slice(self, row, entry: str, rank: int, world: int, dim: int) -> torch.Tensor:
        """torch.chunk(full, world, dim)[rank] of tensor ``row`` of ``entry``,
        ``dim`` in range and the chunk existing (the caller checks)."""
        start, length = _chunk_bounds(row[2][dim], rank, world)
        return self._slice(row, entry, dim, start, length, rank, world)

    def _slice(self, row, entry, dim, start, length, rank, world) -> torch.Tensor:
        """Elements [start, start + length) along ``dim`` of tensor ``row``,
        as the accelerator's (loader/shards.cc): of a tensor stored whole, a
        view; of a sharded one (spec §4.12), rank ``rank`` of ``world``'s own
        slice is a zero-copy view of its block (or, for world = k * W, of a
        part of it), any other a copy of the blocks it spans, never of the
        whole tensor."""
        dtype, sizes, d = row[1], row[2], row[7]
        if d is None or d < 0:
            return self.view(row).narrow(dim, start, length)
        w = self.tp_world
        block_sizes = list(sizes)
        block_sizes[d] //= w
        if d == dim and world % w == 0 and sizes[dim] % world == 0:
            k = world // w
            out = self._block(row, entry, rank // k, block_sizes)
            return out.chunk(k, dim)[rank % k] if k > 1 else out
        out_sizes = list(sizes)
        out_sizes[dim] = length
        if 0 in out_sizes:
            return torch.empty(out_sizes, dtype=dtype)
        if dim == d:  # the blocks [start, start + length) spans, each narrowed
            bs = block_sizes[d]
            pieces = []
            for b in range(start // bs, (start + length - 1) // bs + 1):
                lo, hi = max(start, b * bs), min(start + length, (b + 1) * bs)
                block = self._block(row, entry, b, block_sizes)
                pieces.append(block.narrow(d, lo - b * bs, hi - lo))
        else:  # every block, narrowed along dim, joined along d
            pieces = [self._block(row, entry, b, block_sizes).narrow(dim, start, length)
                      for b in range(w)]
        return torch.cat(pieces, d)  # a copy, also of a single piece

    def _block(self, row, entry, b: int, block_sizes) -> torch.Tensor:
        """Block ``b`` of sharded tensor ``row``: rank b's slice, C-contiguous
        in the mapping (spec §4.12.2)."""
        storage, dtype = row[5], row[1]
        got = self._blocked.get(storage)
        if got is None:
            if type(dtype) is str:
                torch_dtype(dtype, self.path)  # raises UNSUPPORTED
            b_, stride = self._file.blocked_storage(row[0], entry)
            flat = (torch.frombuffer(b_, dtype=torch.uint8) if b_.nbytes else
                    torch.empty(0, dtype=torch.uint8))
            got = self._blocked.setdefault(storage, (as_dtype(flat, dtype), stride))
        flat, stride = got
        strides, n = [0] * len(block_sizes), 1
        for k in range(len(block_sizes) - 1, -1, -1):  # C order (R108)
            strides[k] = n
            n *= block_sizes[k]
        if n == 0:
            return torch.empty(block_sizes, dtype=dtype)
        return flat.as_strided(block_sizes, strides, b * stride // flat.element_size())

    def to_device(self, *args):
        """state_dict(device=): tsar/_portable_device.py."""
        from . import _portable_device

        return _portable_device.to_device(self, *args)


_COO, _CSR, _GROUP = 1, 2, 4  # format::SparseLayout (3: CSC; 4: a tensor group, §4.13)


def _row_of(info) -> tuple:
    """An entry-table row (PortableArchive.table) from the extension's
    TensorInfo tuple (name, entry, dtype name, sizes, strides, offset,
    storage, role, requires_grad, shard_dim)."""
    return (info[0], DTYPES.get(info[2], info[2])) + tuple(info[3:7]) + (info[8], info[9])


def _chunk_bounds(n: int, rank: int, world: int) -> Tuple[int, int]:
    """(start, length) of rank ``rank``'s part of ``n`` split ``world`` ways,
    as torch.chunk gives it (length 0 past the last chunk)."""
    c = -(-n // world)
    start = min(rank * c, n)
    return start, min(c, n - start)


def _chunk_size(n: int, rank: int, world: int) -> int:
    """Rank ``rank``'s part of ``n`` split ``world`` ways, as torch.chunk gives it."""
    return _chunk_bounds(n, rank, world)[1]


def _chunk(t: torch.Tensor, world: int, dim: int, rank: int) -> torch.Tensor:
    return t.narrow(dim, *_chunk_bounds(t.shape[dim], rank, world))


def open_file(path, mode, prefetch, verify, base_dirs) -> PortableArchive:
    return PortableArchive(_tsar_portable.open(path, mode, prefetch, verify, base_dirs))
