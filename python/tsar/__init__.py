"""tsar: the tensor archive, from Python.

Save PyTorch weights into one read-only, page-aligned ``.tsar`` file, then map it
in every worker process: tensors are zero-copy views of the file, and every
process that maps it shares the same page-cache pages (N workers, one copy of
the weights in RAM).

    import tsar
    tsar.save(model, "model.tsar")                 # or a state_dict, or {entry: state_dict}
    model = build_model().eval()                   # the architecture, any weights
    tsar.load_into(model, "model.tsar")            # in place, zero copy
    with tsar.open("model.tsar") as archive:       # or read tensors directly
        w = archive["fc.weight"]

READ-ONLY: in the default ``mode="shared"`` the tensors are read-only memory.
An in-place write (``add_``, an optimizer step, BatchNorm in train mode) kills
the process with SIGSEGV. Use ``module.eval()``, or ``tsar.open(path,
mode="copy_on_write")`` to get private writable pages. See ``help(tsar.Archive)``.

The file format: spec/FORMAT.md in the tsar repository.
"""
import torch  # noqa: F401  (must come before the extension: it registers torch.Tensor)

from ._errors import Error, ErrorCode
from ._archive import Archive, TensorInfo, open
from ._save import PackSummary, pack, save
from ._bind import BindReport, install_fault_handler, load, load_into

__all__ = [
    "Archive",
    "BindReport",
    "Error",
    "ErrorCode",
    "PackSummary",
    "TensorInfo",
    "install_fault_handler",
    "load",
    "load_into",
    "open",
    "pack",
    "save",
]
