"""tsar.save on the portable path: the accelerator's writer
(writer::ArchiveWriter, in tsar._tsar_portable) fed from Python, so that the
same tensors give the same bytes whichever path wrote them. Each tensor goes
over as its dtype's name, sizes, strides, offset and its storage's host
address (python/src/portable_refs.h): no copy of a CPU tensor's bytes. A CUDA
storage is copied to the host first (the archive still records the device, as
the accelerator's does). A sparse COO, CSR or CSC tensor goes over as its
component tensors, in the order and under the names tsar::Writer gives them.
A torchao quantized tensor goes over as a tensor group (spec §4.13): its
inner tensors and its description (tsar/_torchao.py). tsar.save writes every
archive that holds one through here, on either path."""
from __future__ import annotations

import torch

from . import _tsar_portable
from ._errors import Error, ErrorCode

_CUDA = 2  # format::DeviceType::kCuda
_GROUP = 4  # format::SparseLayout::kGroup (spec §4.13)
# format::SparseLayout, and each layout's components as tsar::Writer names them.
_SPARSE = {
    torch.sparse_coo: (1, (("indices", "_indices"), ("values", "_values"))),
    torch.sparse_csr: (2, (("crow_indices", "crow_indices"), ("col_indices", "col_indices"),
                           ("values", "values"))),
    torch.sparse_csc: (3, (("ccol_indices", "ccol_indices"), ("row_indices", "row_indices"),
                           ("values", "values"))),
}


def _refuse(path, name, why, code=ErrorCode.UNSUPPORTED):
    return Error(f'{path}: tensor "{name}": {why}', code, path)


class Tensors:
    """Items for python/src/portable_refs.h, one per tensor; ``keep`` holds
    what owns their bytes (the tensors, host copies of CUDA storages)."""

    def __init__(self, path: str):
        self.path = path
        self.keep = []
        # c10::StorageImpl address (what the accelerator keys storages by) ->
        # (key, host address, nbytes, device type, device index)
        self._storages = {}

    def item(self, name: str, t: torch.Tensor, role: int):
        if _made_of_inner_tensors(t):
            return self._group(name, t, role)
        if t.layout in _SPARSE:
            return self._sparse(name, t, role)
        if t.layout != torch.strided:
            raise _refuse(self.path, name, f"layout {t.layout} is not supported "
                          "(strided, sparse COO, CSR, CSC are)")
        return self._dense(name, t, role)

    def _dense(self, name, t, role):
        if t.is_quantized:
            raise _refuse(self.path, name, "quantized tensors are not supported; dequantize() first")
        if t.device.type not in ("cpu", "cuda"):
            raise _refuse(self.path, name, f"tensors on {t.device} cannot be packed")
        dtype_name = str(t.dtype).replace("torch.", "")
        if t.is_conj() or t.is_neg():  # the bits another view would read differently
            t = t.resolve_conj().resolve_neg()
        s = t.untyped_storage()
        st = self._storages.get(s._cdata)
        if st is None:
            if t.device.type == "cuda":
                host = s.cpu()
                self.keep.append(host)
                st = (len(self._storages), host.data_ptr(), host.nbytes(), _CUDA, t.device.index)
            else:
                st = (len(self._storages), s.data_ptr(), s.nbytes(), 0, 0)
            self._storages[s._cdata] = st
        self.keep.append(t)
        return (name, int(role), dtype_name, tuple(t.shape), tuple(t.stride()),
                t.storage_offset(), t.requires_grad, st)

    def _sparse(self, name, t, role):
        layout, parts = _SPARSE[t.layout]
        coalesced = t.layout == torch.sparse_coo and t.is_coalesced()
        components = []
        for suffix, method in parts:
            part = getattr(t, method)()
            if part.layout != torch.strided or part.is_quantized or \
                    part.device.type not in ("cpu", "cuda"):
                raise _refuse(self.path, f"{name}.{suffix}",
                              "component of an unsupported dtype or device")
            components.append((f".{suffix}", self._dense(f"{name}.{suffix}", part, role)))
        return (name, int(role), layout, coalesced, tuple(t.shape), components)


    def _group(self, name, t, role):
        """A torchao tensor as a group item (python/src/portable_refs.h):
        its inner tensors as components "<name>.<member>", in the order of
        its class's flatten, and its description."""
        from . import _torchao

        g = _torchao.flatten(name, t)  # tsar.Error naming it for any other subclass
        components = [(f".{member}", self._dense(f"{name}.{member}", inner, role))
                      for member, inner in g.tensors.items()]
        return (name, int(role), _GROUP, False, g.shape, components,
                str(g.dtype).replace("torch.", ""), g.stride, _torchao.describe(g))


def _made_of_inner_tensors(t: torch.Tensor) -> bool:
    """A tensor subclass made of inner tensors (``__tensor_flatten__``: a
    torchao weight), stored as a group, or refused naming it."""
    return (type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter
            and getattr(type(t), "__tensor_flatten__", None) is not None)


def has_groups(entries) -> bool:
    """Whether tsar.save's entries hold a tensor subclass made of inner
    tensors, which only this writer takes."""
    return any(_made_of_inner_tensors(t) for _, items in entries for _, t, _ in items)


def save(path: str, entries, metadata, alignment: int, dtype: str, base: str, durable: bool,
         world: int, plan):
    """As ``_tsar.save`` (python/src/module.cc), with the same arguments."""
    tensors = Tensors(path)
    out = [(entry, [tensors.item(name, t, role) for name, t, role in items])
           for entry, items in entries]
    _tsar_portable.save(path, out, metadata, alignment, dtype, base, durable, world, plan)
    del tensors
