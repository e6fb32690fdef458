#!/usr/bin/python3
"""make_model.py OUTDIR: the built-in sample model of the demo: torchvision's
resnet18 (random weights, seed 0), scripted and saved with its weights as
OUTDIR/resnet18_ts.pt: what a baseline worker loads (architecture and weights,
a private copy per process), and what the demo packs with
`tsar pack resnet18_ts.pt -o resnet18.tsar --arch resnet18_arch_ts.pt`.

Where this torch can (2.8 and later: AOTInductor packages with user-managed
constants), also OUTDIR/resnet18.aoti.pt2: the model exported and compiled by
tsar.compile_aoti (about a minute on 2 cores), which the demo stores in the
archive as its program; the tsar workers then serve the compiled program
(tsar_worker --aoti) instead of TorchScript, which torch deprecates. A torch
too old for it keeps TorchScript, and this says so.
"""
import os
import sys
import time
import warnings

import torch
import torchvision


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    with warnings.catch_warnings():  # the baseline is TorchScript, deprecated: said above
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(model), os.path.join(out, "resnet18_ts.pt"))
    try:
        import tsar
        from tsar import _programs
        why = _programs.unsupported(aoti=True)
    except ImportError as e:
        why = f"tsar's Python package is not importable ({e})"
    if why:
        print(f"make_model: no AOTInductor program ({why}); the tsar workers use TorchScript")
        return
    t = time.time()
    program = torch.export.export(model, (torch.randn(2, 3, 64, 64),), dynamic_shapes=(
        {0: torch.export.Dim("batch", max=256)},))
    tsar.compile_aoti(program, os.path.join(out, "resnet18.aoti.pt2"))
    print(f"make_model: exported and compiled with AOTInductor in {time.time() - t:.0f} s")


if __name__ == "__main__":
    main()
