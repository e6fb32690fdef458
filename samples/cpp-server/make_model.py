#!/usr/bin/python3
"""make_model.py OUTDIR: the built-in sample model of the demo: torchvision's
resnet18 (random weights, fixed seed) saved by torch.save (weights) and
torch.jit.save (architecture + weights)."""
import os
import sys

import torch
import torchvision

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None).eval()
torch.save(model.state_dict(), os.path.join(out, "resnet18.pt"))
torch.jit.save(torch.jit.script(model), os.path.join(out, "resnet18_ts.pt"))
