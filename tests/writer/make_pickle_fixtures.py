#!/usr/bin/python3
# Writes torch.save fixtures for tests/writer/pickle_test.cc into argv[1]: for each
# case <name>.pt, its extracted <name>.data.pkl and <name>.expected.json (tensor facts
# computed in Python from the real tensors). Run with Debian's python3-torch.
import collections
import json
import os
import sys
import zipfile

import torch


def resnet_state_dict():
    try:
        import torchvision
        return torchvision.models.resnet18(weights=None).state_dict()
    except Exception:  # torchvision missing or too old: a small stand-in
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 4))
        return m.state_dict()


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        full = torch.arange(16, dtype=torch.float32)
        self.register_buffer("full", full)
        self.register_buffer("part", full[4:12].view(2, 4))
        self.register_buffer("tr", full[:12].view(3, 4).t())


def small_model_state_dict(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    return m.state_dict()


def dtypes_case():
    out = {}
    for dt in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
               torch.int64, torch.float16, torch.bfloat16, torch.float32,
               torch.float64, torch.complex64, torch.complex128):
        out[str(dt).replace("torch.", "")] = (torch.arange(6) % 3).to(dt).reshape(2, 3)
    out["scalar0d"] = torch.tensor(3.5)
    out["empty"] = torch.zeros(0, 3)
    base = torch.arange(40, dtype=torch.float32).reshape(5, 8)
    out["slice"] = base[1:4, 2:7:2]  # non-contiguous, storage offset 10
    return out


def params_case():
    torch.manual_seed(1)
    lin = torch.nn.Linear(4, 3)
    lin.bias.requires_grad_(False)
    return dict(lin.named_parameters())


def flatten(obj, prefix, out):
    """Tensors in pickling order (depth first, dict insertion order), with paths."""
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}.{i}" if prefix else str(i), out)


def storage_bytes(t):
    """All bytes of t's storage (not just of the view), as the zip record holds them."""
    st = t.storage()
    whole = torch.empty(0, dtype=t.dtype).set_(st, 0, (st.size(),), (1,))
    if whole.numel() == 0:
        return b""
    if whole.dtype.is_complex:
        whole = torch.view_as_real(whole)
    return whole.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def write_case(out_dir, name, obj, scalars=None, protocol=2):
    pt = os.path.join(out_dir, name + ".pt")
    torch.save(obj, pt, pickle_protocol=protocol)
    with zipfile.ZipFile(pt) as z:
        names = z.namelist()
        prefix = names[0].split("/")[0] + "/"
        pkl = z.read(prefix + "data.pkl")
        records = {n[len(prefix) + len("data/"):]: n for n in names
                   if n.startswith(prefix + "data/")}
        tensors, keys = [], {}
        flat = []
        flatten(obj, "", flat)
        for path, t in flat:
            st = t.storage()
            # torch.save names storages "0", "1", ... by StorageImpl (_cdata) in order
            # of first appearance while pickling; the record check below proves it.
            key = keys.setdefault(st._cdata, str(len(keys)))
            data = z.read(records[key])
            assert data == storage_bytes(t), (name, path)
            tensors.append({
                "path": path, "dtype": str(t.dtype).replace("torch.", ""),
                "sizes": list(t.shape), "strides": list(t.stride()),
                "storage_offset": t.storage_offset(), "storage_key": key,
                "storage_numel": st.size(), "location": "cpu",
                "requires_grad": bool(t.requires_grad),
                "is_parameter": isinstance(t, torch.nn.Parameter)})
        assert len(keys) == len(records), (name, keys, records)
    with open(os.path.join(out_dir, name + ".data.pkl"), "wb") as f:
        f.write(pkl)
    with open(os.path.join(out_dir, name + ".expected.json"), "w") as f:
        json.dump({"tensors": tensors, "scalars": scalars or {}}, f, indent=1)


def write_raw_case(out_dir, name, pkl):
    with zipfile.ZipFile(os.path.join(out_dir, name + ".pt"), "w") as z:
        z.writestr(name + "/data.pkl", pkl)
    with open(os.path.join(out_dir, name + ".data.pkl"), "wb") as f:
        f.write(pkl)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    write_case(out_dir, "resnet_sd", resnet_state_dict())
    write_case(out_dir, "tied", Tied().state_dict())
    write_case(out_dir, "plain_one", {"x": torch.arange(6.).reshape(2, 3)})
    nested = {"model": small_model_state_dict(2), "ema": small_model_state_dict(3),
              "step": 10, "lr": 0.5, "name": "run1", "flag": True}
    write_case(out_dir, "nested", nested,
               scalars={"step": 10, "lr": 0.5, "name": "run1", "flag": True})
    write_case(out_dir, "dtypes", dtypes_case())
    write_case(out_dir, "params", params_case())
    # Protocol 4 (FRAME, MEMOIZE, SHORT_BINUNICODE, STACK_GLOBAL), which
    # torch.save(..., pickle_protocol=4) writes.
    write_case(out_dir, "proto4", small_model_state_dict(4), protocol=4)
    # os.system("echo pwned") the way a malicious checkpoint spells it; written
    # by hand so that the module reads "os" (pickle.dumps would write "posix").
    evil = (b"\x80\x02cos\nsystem\nq\x00X\x0a\x00\x00\x00echo pwnedq\x01\x85q\x02Rq\x03.")
    write_raw_case(out_dir, "evil", evil)


if __name__ == "__main__":
    main()
