"""python -m tsar: which of tsar's two paths this environment runs, why, what
each can do here, and how to get the accelerator (issue 57, "which path, and
why, at a glance")."""
from __future__ import annotations

import os
import shutil
import sys


def report() -> str:
    import torch

    import tsar
    from tsar import _backend
    from tsar._build_info import hdf5, torch_version as built_for

    lines = [f"tsar {tsar.__version__} ({os.path.dirname(os.path.abspath(tsar.__file__))})"]
    cuda = (f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)"
            if torch.cuda.is_available() else
            f"CUDA {torch.version.cuda}, no GPU" if torch.version.cuda else "CPU build")
    lines.append(f"torch {torch.__version__} ({cuda})")
    lines.append(f"path: {tsar.backend()}")
    accelerator = _backend.accelerator is not None
    lines.append("  both paths: open, load_into (strict, ties, meta modules, rank=/world=, "
                 "device=), state_dict, shard, save, pack, LiveModule, tsar.transformers")
    if accelerator:
        lines.append("  this path: tsar's C++ loader linked against this torch's LibTorch "
                     "(binds at about half the portable path's time)")
    else:
        lines.append("  this path: no LibTorch linked; tensors made through torch's Python API "
                     "and DLPack (works with any torch 2.7 to 2.15)")
        if built_for and _backend.why_portable == "TSAR_PORTABLE is set":
            lines.append(f"  the accelerator: built for torch {built_for}; unset TSAR_PORTABLE "
                         "to use it" + ("" if built_for == torch.__version__ else
                                        f" beside torch {built_for}"))
        elif built_for == torch.__version__:
            lines.append(f"  the accelerator: built for this torch, but {_backend.why_portable}: "
                         "reinstall tsar (pip install --force-reinstall --no-deps <tsar source>)")
        elif built_for:
            lines.append(f"  the accelerator: built for torch {built_for}; to get it here, install "
                         f"torch {built_for}, or build tsar beside this torch: pip install "
                         "--force-reinstall --no-deps <tsar source>")
        else:
            lines.append("  the accelerator: not built into this tsar; build tsar beside this "
                         "torch: pip install --force-reinstall --no-deps <tsar source>")
    cli = shutil.which("tsar")
    lines.append(f"tsar command: {cli or 'not on PATH'}"
                 + ("" if cli is None else
                    " (TorchScript inputs, --arch and export to .pt need its tsar-torch, "
                    f"which runs beside torch {built_for or 'it was built for'} only)"))
    lines.append(f"HDF5 inputs: {'yes' if hdf5 else 'no (not in the wheel; build from source)'}")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print("usage: python -m tsar\n\nPrints which of tsar's two paths this environment runs "
              "(the accelerator, linked against this torch's LibTorch, or the portable path, "
              "for any torch), why, what each path can do here, and how to get the accelerator. "
              "TSAR_PORTABLE=1 chooses the portable path.")
        return 0
    print(report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
