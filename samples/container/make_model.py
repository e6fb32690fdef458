#!/usr/bin/python3
"""make_model.py OUTDIR: the models of the container sample, as TorchScript
files with their weights:

  OUTDIR/resnet18_ts.pt     torchvision's resnet18 (random weights, seed 0, so
                            every run makes the same tensors): the base
  OUTDIR/resnet18_ft_ts.pt  a fine-tuned variant of it: the classifier head
                            (fc.weight, fc.bias: 2 MB of the 45 MB) retrained,
                            every other tensor the base's

build.sh packs the base with `tsar pack --arch` (the weights into the archive,
the architecture without weights, about 90 KB, into the file the worker loads
before tsar::bind points the weights at the archive) and the variant as a tsar
layer over the base (`tsar pack --base`): only the head's bytes are its own.
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
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # "fine-tuning": a new head
        model.fc.weight.add_(0.01 * torch.randn(model.fc.weight.shape, generator=g))
        model.fc.bias.add_(0.01 * torch.randn(model.fc.bias.shape, generator=g))
    torch.jit.save(torch.jit.script(model), os.path.join(out, "resnet18_ft_ts.pt"))


if __name__ == "__main__":
    main()
