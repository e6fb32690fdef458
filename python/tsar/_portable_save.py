"""tsar.save on the portable path: the accelerator's writer
(writer::ArchiveWriter, in tsar._tsar_portable) fed from Python, so that the
same tensors give the same bytes whichever path wrote them. Each tensor goes
over as its dtype's name, sizes, strides, offset and its storage's host
address: no copy of a CPU tensor's bytes. A CUDA storage is copied to the host
first (the archive still records the device, as the accelerator's does).
Sparse tensors need the accelerator."""
from __future__ import annotations

import torch

from . import _tsar_portable
from ._errors import Error, ErrorCode
from ._portable import unsupported

_CUDA = 2  # format::DeviceType::kCuda


def _refuse(path, name, why, code=ErrorCode.UNSUPPORTED):
    return Error(f'{path}: tensor "{name}": {why}', code, path)


def save(path: str, entries, metadata, alignment: int, dtype: str, base: str, durable: bool,
         world: int, plan):
    """As ``_tsar.save`` (python/src/module.cc), with the same arguments."""
    keep = []  # host copies of CUDA storages, alive until the write is done
    # c10::StorageImpl address (what the accelerator keys storages by) ->
    # (key, host address, nbytes, device type, device index)
    storages = {}
    out = []
    for entry, tensors in entries:
        items = []
        for name, t, role in tensors:
            if t.layout != torch.strided:
                raise unsupported(path, f"saving sparse tensor {name!r}")
            if t.is_quantized:
                raise _refuse(path, name, "quantized tensors are not supported; dequantize() first")
            if t.device.type not in ("cpu", "cuda"):
                raise _refuse(path, name, f"tensors on {t.device} cannot be packed")
            dtype_name = str(t.dtype).replace("torch.", "")
            if t.is_conj() or t.is_neg():  # the bits another view would read differently
                t = t.resolve_conj().resolve_neg()
            s = t.untyped_storage()
            key = s._cdata
            st = storages.get(key)
            if st is None:
                if t.device.type == "cuda":
                    host = s.cpu()
                    keep.append(host)
                    st = (len(storages), host.data_ptr(), host.nbytes(), _CUDA, t.device.index)
                else:
                    st = (len(storages), s.data_ptr(), s.nbytes(), 0, 0)
                storages[key] = st
            keep.append(t)
            items.append((name, int(role), dtype_name, tuple(t.shape), tuple(t.stride()),
                          t.storage_offset(), t.requires_grad, st))
        out.append((entry, items))
    _tsar_portable.save(path, out, metadata, alignment, dtype, base, durable, world, plan)
    del keep
