#!/usr/bin/python3
"""make_model.py OUTDIR [--inputs N --hidden N --depth N --outputs N --seed S]

Writes the sample's MLP (random weights, fixed seed) three ways:
  OUTDIR/model.json  the architecture (what a server builds before it has weights)
  OUTDIR/model.pt    torch.save(state_dict): what the --torch-load baseline reads
  OUTDIR/model.tsar  tsar.save(model): what the tsar workers map and bind
The defaults give 2048-2048x4-16, about 64 MiB of float32 weights.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlp  # noqa: E402


def make(outdir, inputs=2048, hidden=2048, depth=4, outputs=16, seed=0):
    import tsar
    os.makedirs(outdir, exist_ok=True)
    arch = {"inputs": inputs, "hidden": hidden, "depth": depth, "outputs": outputs}
    torch.manual_seed(seed)
    net = mlp.build(arch)
    with torch.no_grad():
        net.scale.uniform_(0.5, 1.5)
    paths = {k: os.path.join(outdir, "model." + k) for k in ("json", "pt", "tsar")}
    with open(paths["json"], "w") as f:
        json.dump(arch, f)
        f.write("\n")
    torch.save(net.state_dict(), paths["pt"])
    tsar.save(net, paths["tsar"], metadata={"arch": json.dumps(arch, sort_keys=True), "seed": seed})
    return arch, paths


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--inputs", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=4, help="number of hidden layers")
    ap.add_argument("--outputs", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    arch, paths = make(a.outdir, a.inputs, a.hidden, a.depth, a.outputs, a.seed)
    print(f"wrote {paths['json']}, {paths['pt']} and {paths['tsar']} "
          f"({mlp.weight_bytes(arch) / 2**20:.1f} MiB of weights)")


if __name__ == "__main__":
    main()
