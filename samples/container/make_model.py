#!/usr/bin/python3
"""make_model.py OUTDIR: the model of the container sample: torchvision's
resnet18 (random weights, seed 0, so every run makes the same tensors),
scripted and saved with its weights as OUTDIR/resnet18_ts.pt. build.sh packs
it with `tsar pack --arch`: the weights into the archive, the architecture
without weights (about 90 KB) into the file tsar_worker loads before
tsar::bind points the weights at the archive.
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
