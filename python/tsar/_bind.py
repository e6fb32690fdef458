"""tsar.load_into (rebind a module in place, zero copy) and tsar.load."""
import os
from typing import Dict, List, NamedTuple, Optional, Union

import torch

from . import _tsar
from ._archive import Archive, open as _open


class BindReport(NamedTuple):
    bound: List[str]  # names now pointing into the archive
    missing: List[str]  # in the module, not in the archive
    unexpected: List[str]  # in the archive, not in the module
    mismatched: List[str]  # "name: shape [2, 3] vs archive [3, 2]", dtype likewise


def load_into(
    module: torch.nn.Module,
    path_or_archive: Union[str, os.PathLike, Archive],
    *,
    entry: Optional[str] = None,
    strict: bool = True,
    allow_training: bool = False,
    archive_prefix: str = "",
    module_prefix: str = "",
) -> BindReport:
    """Points every parameter and buffer of ``module`` at the archive, in place.

    No copy: afterwards each parameter is the same ``Parameter`` object as
    before (optimizers and hooks holding it stay valid), with its data inside
    the archive's mapping; tied parameters are still one object;
    ``requires_grad`` is kept. Names are those of ``module.state_dict()``.
    ``entry`` defaults to the only entry; with several (a checkpoint) to the one
    named ``"model"``, else the only one holding parameters or buffers, else
    tsar.Error (NOT_FOUND) lists them and asks for ``entry=``.

    strict=True: any name missing from the archive, not in the module, or with
    another shape or dtype raises one :class:`tsar.Error` (BIND_MISMATCH)
    listing them all, and the module is left unchanged. strict=False binds what
    matches and reports the rest.

    Over a ``mode="shared"`` archive the weights are read-only memory: a module
    with any submodule in training mode (BatchNorm writes its running stats)
    raises tsar.Error (INVALID_ARGUMENT). Call ``module.eval()`` first, open the
    archive with ``mode="copy_on_write"``, or pass ``allow_training=True`` if you
    know nothing writes.

    Names that differ by a prefix: ``archive_prefix="module."`` binds an
    archive of a DDP model (``module.fc.weight``) into the plain model;
    ``module_prefix="model."`` binds a plain archive into a module that wraps
    the model as ``self.model``. A module name ``M`` then matches the archive
    name ``archive_prefix + (M without module_prefix)``; module names without
    ``module_prefix`` are missing (``BindOptions`` in C++).

    Devices: a module on the CPU, or built on the meta device (``with
    torch.device("meta"): model = Model()``, or ``model.to("meta")``), or partly
    both. A meta tensor becomes a CPU tensor inside the mapping in place: the
    same ``Parameter`` object, as for a CPU tensor, so no weight memory is ever
    allocated. A meta tensor the archive does not bind is refused (BIND_MISMATCH)
    even with strict=False, and a tensor on any other device (CUDA...) is
    refused (INVALID_ARGUMENT) naming it; either way nothing is changed.

    Returns a :class:`BindReport`. Not thread-safe for one module.
    """
    archive = path_or_archive if isinstance(path_or_archive, Archive) else _open(path_or_archive)
    items = list(module.state_dict(keep_vars=True).items())
    training = any(m.training for m in module.modules())
    bound, missing, unexpected, mismatched = _tsar.bind(
        archive._a(), items, training, entry or "", bool(strict), bool(allow_training),
        str(archive_prefix), str(module_prefix),
    )
    return BindReport(bound, missing, unexpected, mismatched)


def load(path: Union[str, os.PathLike], entry: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """``{name: tensor}`` of ``entry`` (default: the first), zero-copy over a
    shared read-only mapping (see :class:`tsar.Archive` about in-place writes).
    The shape of ``safetensors.torch.load_file``."""
    return dict(_open(path).state_dict(entry))


def install_fault_handler() -> None:
    """Installs a SIGSEGV/SIGBUS handler: a write into a read-only archive then
    prints ``tsar: write to read-only archive <path>: storage #i used by tensor
    "<name>"...`` before the process dies. Chains to any previous handler
    (Python's faulthandler included) for other faults."""
    _tsar.install_fault_handler()
