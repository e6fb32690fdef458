"""The sample's model: a plain MLP, described by a small JSON file (model.json)
so that a server can build the architecture without any weights."""
import json

import torch


class MLP(torch.nn.Module):
    def __init__(self, inputs, hidden, depth, outputs, empty=False):
        super().__init__()
        dims = [inputs] + [hidden] * depth + [outputs]
        if empty:
            # The architecture only: parameters of the right names, shapes and dtypes,
            # allocated but never written (no memory is touched, so none is resident).
            # tsar.load_into or load_state_dict gives them their values.
            layers = [torch.nn.utils.skip_init(torch.nn.Linear, a, b) for a, b in zip(dims, dims[1:])]
        else:
            layers = [torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:])]
        self.layers = torch.nn.ModuleList(layers)
        self.register_buffer("scale", torch.ones(outputs) if not empty else torch.empty(outputs))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x * self.scale


def build(arch, empty=False):
    """arch: {"inputs", "hidden", "depth", "outputs"} (model.json)."""
    return MLP(arch["inputs"], arch["hidden"], arch["depth"], arch["outputs"], empty=empty).eval()


def load_arch(path):
    with open(path) as f:
        arch = json.load(f)
    for k in ("inputs", "hidden", "depth", "outputs"):
        if not isinstance(arch.get(k), int) or arch[k] < 1:
            raise ValueError(f"{path}: {k!r} must be a positive integer")
    return arch


def weight_bytes(arch):
    dims = [arch["inputs"]] + [arch["hidden"]] * arch["depth"] + [arch["outputs"]]
    return 4 * (sum(a * b + b for a, b in zip(dims, dims[1:])) + arch["outputs"])
