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

from ._build_info import __version__
from . import _backend
from ._errors import Error, ErrorCode
from ._archive import Archive, open
from ._bind import BindReport, install_fault_handler, load, load_into


def backend() -> str:
    """Which path this process runs, and why: ``"accelerator (...)"``, tsar's
    C++ loader built for exactly this torch, or ``"portable (...)"``, the path
    that links no LibTorch and works with any torch of the supported range:
    the same calls and the same bytes, binding at about half the speed. ``pip
    install --force-reinstall --no-deps <tsar source>`` builds the accelerator
    for the torch installed (or install the torch it was built for)."""
    return _backend.describe()

# Imported on first use: a worker that only opens and binds does not pay for
# the writer's, the hot-swap module's and TensorInfo's definitions (4 ms of
# `import tsar`).
_LAZY = {"empty_parameters": "_empty",
         "TensorInfo": "_info", "PackSummary": "_save", "pack": "_save", "save": "_save",
         "LiveEvent": "_live", "LiveModule": "_live",
         "load_program": "_programs_load", "load_aoti": "_programs_load",
         "compile_aoti": "_programs"}


def __getattr__(name):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'tsar' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module("." + where, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    "Archive",
    "backend",
    "compile_aoti",
    "empty_parameters",
    "BindReport",
    "Error",
    "ErrorCode",
    "LiveEvent",
    "LiveModule",
    "PackSummary",
    "TensorInfo",
    "install_fault_handler",
    "load",
    "load_aoti",
    "load_into",
    "load_program",
    "open",
    "pack",
    "save",
]
