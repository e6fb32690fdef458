#!/usr/bin/python3
"""make_data.py OUTDIR: the PyTorch-made inputs of the benchmarks (bench/README.md).

stack_sd.pt      512 MiB fp32 state_dict of 64 tensors: nn.Sequential of 32
                 Linear(2048, 2048), saved as torch.save(dict(sd)) (LibTorch
                 1.13's torch::pickle_load refuses an OrderedDict).
stack_ts.pt      the same model, torch.jit.save(torch.jit.script(model)).
resnet18_sd.pt   torchvision resnet18 (random weights, seed 0), dict(state_dict).
resnet18_ts.pt   the same model scripted, weights included (the peer of P2).
resnet18_arch_ts.pt  the same scripted architecture with every floating-point
                 parameter and buffer replaced by a stride-0 view of one zero:
                 right shapes and dtypes, 4 bytes of storage each. tsar binds
                 its weights; the file holds no weights to load.
"""
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from weightless import strip_weights  # noqa: E402

torch.set_num_threads(1)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    torch.manual_seed(0)
    stack = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(32)]).eval()
    sd = stack.state_dict()
    assert len(sd) == 64
    assert sum(t.numel() * t.element_size() for t in sd.values()) == 32 * (2048 * 2048 + 2048) * 4
    torch.save(dict(sd), os.path.join(out, "stack_sd.pt"))
    torch.jit.save(torch.jit.script(stack), os.path.join(out, "stack_ts.pt"))
    del stack, sd

    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None).eval()
    torch.save(dict(resnet.state_dict()), os.path.join(out, "resnet18_sd.pt"))
    torch.jit.save(torch.jit.script(resnet), os.path.join(out, "resnet18_ts.pt"))
    torch.jit.save(torch.jit.script(strip_weights(resnet)), os.path.join(out, "resnet18_arch_ts.pt"))

    for f in sorted(os.listdir(out)):
        print(f"make_data: {f} {os.path.getsize(os.path.join(out, f)):,} bytes")


if __name__ == "__main__":
    main()
