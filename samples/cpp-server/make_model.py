#!/usr/bin/python3
"""make_model.py OUTDIR: the built-in sample model of the demo: torchvision's
resnet18 (random weights, seed 0).

OUTDIR/resnet18.pt          torch.save(state_dict): what `tsar pack` packs.
OUTDIR/resnet18_ts.pt       torch.jit.save of the whole model: what a baseline
                            worker loads (architecture and weights, a private copy).
OUTDIR/resnet18_arch_ts.pt  the TorchScript architecture with every floating
                            point parameter and buffer replaced by a stride-0
                            view of one zero (right names, shapes, dtypes; ~90 KB):
                            what a tsar worker loads before tsar::bind.
"""
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from weightless import strip_weights  # noqa: E402


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    torch.save(model.state_dict(), os.path.join(out, "resnet18.pt"))
    torch.jit.save(torch.jit.script(model), os.path.join(out, "resnet18_ts.pt"))
    torch.jit.save(torch.jit.script(strip_weights(model)), os.path.join(out, "resnet18_arch_ts.pt"))


if __name__ == "__main__":
    main()
