"""`tsar inspect` on views whose logical size passes 2^64 bytes (issue 16, item 7):
a broadcast view of 2^62 elements stores 4 bytes, and its logical byte count is
reported exactly (JSON) or in EiB (text), never wrapped to 0."""
import json
import subprocess

import torch

import tsar


def test_inspect_reports_logical_bytes_past_2_64(cli, tmp_path):
    path = tmp_path / "huge_view.tsar"
    tsar.save({"x": torch.ones(1).expand(2**31, 2**31), "y": torch.ones(1, dtype=torch.float64).expand(2**31)},
              path)
    with tsar.open(path) as a:
        assert a.info("x").shape == (2**31, 2**31) and a.info("x").strides == (0, 0)
    out = subprocess.run([cli, "inspect", "--json", str(path)], capture_output=True, text=True, check=True)
    tensors = {t["name"]: t for t in json.loads(out.stdout)["tensors"]}
    assert tensors["x"]["nbytes"] == float(2**64)  # 2^62 float32 elements, as a JSON double
    assert tensors["y"]["nbytes"] == 2**34  # fits 64 bits: an exact integer
    assert isinstance(tensors["y"]["nbytes"], int)
    text = subprocess.run([cli, "inspect", str(path)], capture_output=True, text=True, check=True).stdout
    line = next(line for line in text.splitlines() if line.strip().startswith("x "))
    assert "16.0 EiB" in line, text
    assert " 0 B" not in line
