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

from ._build_info import __version__, torch_version as _built_against

# The extension links this torch's LibTorch by name: against another build it
# would fail with undefined symbols, or worse, run with a different ABI.
if torch.__version__ != _built_against:
    # pip refuses a local version ("2.15.0+cu132") from the package index: name
    # the public one, and where the local build comes from.
    _public, _, _local = _built_against.partition("+")
    raise ImportError(
        f"tsar {__version__} was built against torch {_built_against}, but this environment "
        f"has torch {torch.__version__} ({torch.__file__}): rebuild tsar in this "
        f"environment (pip install --force-reinstall --no-deps <tsar source folder>), or "
        f"install torch=={_public}"
        + (f" (tsar was built against its {_local} build: pip install torch=={_public} "
           f"--index-url https://download.pytorch.org/whl/{_local})" if _local else "")
    )

from ._errors import Error, ErrorCode
from ._archive import Archive, open
from ._bind import BindReport, install_fault_handler, load, load_into

# Imported on first use: a worker that only opens and binds does not pay for
# the writer's, the hot-swap module's and TensorInfo's definitions (4 ms of
# `import tsar`).
_LAZY = {"empty_parameters": "_empty",
         "TensorInfo": "_info", "PackSummary": "_save", "pack": "_save", "save": "_save",
         "LiveEvent": "_live", "LiveModule": "_live"}


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
    "load_into",
    "open",
    "pack",
    "save",
]
