#!/usr/bin/python3
"""make_model.py OUTDIR: the model of the container sample: torchvision's
resnet18 (random weights, seed 0, so every run makes the same tensors).

OUTDIR/resnet18.pt           torch.save(dict(state_dict)): what `tsar pack` packs.
OUTDIR/resnet18_arch_ts.pt   the TorchScript architecture with every floating
                             point parameter and buffer replaced by a stride-0
                             view of one zero: right names, shapes and dtypes,
                             no weights (90 KB). tsar_worker loads it, then
                             tsar::bind points the weights at the archive.
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
    torch.save(dict(model.state_dict()), os.path.join(out, "resnet18.pt"))
    torch.jit.save(torch.jit.script(strip_weights(model)), os.path.join(out, "resnet18_arch_ts.pt"))


if __name__ == "__main__":
    main()
