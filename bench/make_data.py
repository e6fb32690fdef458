#!/usr/bin/python3
"""make_data.py OUTDIR: the PyTorch-made inputs of the benchmarks (bench/README.md).

stack_sd.pt      512 MiB fp32 state_dict of 64 tensors: nn.Sequential of 32
                 Linear(2048, 2048), saved as torch.save(dict(sd)) (LibTorch
                 1.13's torch::pickle_load refuses an OrderedDict).
stack_ts.pt      the same model, torch.jit.save(torch.jit.script(model)).
resnet18_sd.pt   torchvision resnet18 (random weights, seed 0), dict(state_dict).
resnet18_ts.pt   the same model scripted, weights included (the peer of P2).
                 tsar_bench packs it with `tsar pack --arch` for the scripted
                 architecture without weights (resnet18_arch_ts.pt) that P2
                 binds: every weight a stride-0 view of one zero.
"""
import os
import sys

import torch
import torchvision

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

    for f in sorted(os.listdir(out)):
        print(f"make_data: {f} {os.path.getsize(os.path.join(out, f)):,} bytes")


if __name__ == "__main__":
    main()
