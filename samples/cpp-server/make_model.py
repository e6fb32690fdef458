#!/usr/bin/python3
"""make_model.py OUTDIR: the built-in sample model of the demo: torchvision's
resnet18 (random weights, seed 0), scripted and saved with its weights as
OUTDIR/resnet18_ts.pt: what a baseline worker loads (architecture and weights,
a private copy per process), and what the demo packs with
`tsar pack resnet18_ts.pt -o resnet18.tsar --arch resnet18_arch_ts.pt`, which
also writes the architecture without its weights for the tsar workers.
"""
import os
import sys

import torch
import torchvision


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    torch.jit.save(torch.jit.script(model), os.path.join(out, "resnet18_ts.pt"))


if __name__ == "__main__":
    main()
