"""What a new user of the command line runs into (issue 12): totals and aligned
columns in `tsar inspect`, inputs of `tsar pack` named as such, ..."""
import json
import re
import subprocess

import torch

import tsar


def run(cli, *args, code=0):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == code, (args, r.stdout, r.stderr)
    return r


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10))


def test_inspect_totals_count_elements_by_role_and_dtype(cli, tmp_path):
    net = small_net().eval()
    script = torch.jit.script(net)
    script.save(str(tmp_path / "net_ts.pt"))
    run(cli, "pack", "-q", tmp_path / "net_ts.pt", "-o", tmp_path / "net.tsar")
    doc = json.loads(run(cli, "inspect", "--json", tmp_path / "net.tsar").stdout)
    params = sum(p.numel() for p in net.parameters())
    buffers = sum(b.numel() for b in net.buffers())
    totals = doc["totals"]
    assert totals["parameters"] == params and totals["buffers"] == buffers
    assert totals["elements"] == params + buffers
    floats = [t for t in net.state_dict().values() if t.dtype == torch.float32]
    assert totals["dtypes"]["float32"] == {"tensors": len(floats), "elements": sum(t.numel() for t in floats),
                                           "stored_bytes": sum(t.numel() * 4 for t in floats)}
    assert totals["dtypes"]["int64"] == {"tensors": 1, "elements": 1, "stored_bytes": 8}
    text = run(cli, "inspect", tmp_path / "net.tsar").stdout
    assert f"totals: {params + buffers:,} elements in {len(net.state_dict())} tensors " \
           f"(parameters {params:,}, buffers {buffers:,})" in text, text
    assert re.search(r"^  float32 +%d +%s +" % (len(floats), f"{sum(t.numel() for t in floats):,}"),
                     text, re.M), text


def test_inspect_columns_stay_aligned_for_strided_tensors_and_long_names(cli, tmp_path):
    sd = {"w": torch.randn(3, 4), "a." * 40 + "long": torch.randn(10, 10).t(),
          "exp": torch.ones(1).expand(1000), "off": torch.arange(10.0)[3:]}
    tsar.save(sd, tmp_path / "m.tsar")
    text = run(cli, "inspect", tmp_path / "m.tsar").stdout
    rows = [line for line in text.splitlines() if line.startswith("  ") and ("float32" in line or "DTYPE" in line)
            and "TENSORS" not in line and not re.match(r"^  float32 +\d", line)]
    assert len(rows) == 5, text
    for column in ("DTYPE", "SHAPE", "STORAGE", "ROLE"):
        start = rows[0].index(column)
        assert all(row[start - 2:start] == "  " and row[start] != " " for row in rows[1:]), (column, text)
    assert "[10, 10] strides [1, 10]" in text and "+3" in text


def test_inspect_of_a_pack_input_says_what_it_is(cli, tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "m.pt")
    for command in (["inspect"], ["verify"], ["export", "-o", tmp_path / "x.safetensors"]):
        r = run(cli, *command[:1], tmp_path / "m.pt", *command[1:], code=3)
        assert r.stderr == f"tsar: {tmp_path / 'm.pt'}: this is a torch.save file, not a tsar archive; " \
                           f"pack it first: tsar pack {tmp_path / 'm.pt'} -o ARCHIVE.tsar\n", r.stderr


def test_packing_a_weightless_architecture_warns_and_strict_refuses(cli, tmp_path):
    # What a weightless architecture looks like: every floating tensor expanded from one element.
    sd = {k: torch.zeros(1, dtype=v.dtype).expand(v.shape) if v.is_floating_point() else v
          for k, v in small_net().state_dict().items()}
    torch.save(sd, tmp_path / "arch.pt")
    r = run(cli, "pack", tmp_path / "arch.pt", "-o", tmp_path / "arch.tsar")
    assert r.stderr == f"tsar: note: {tmp_path / 'arch.pt'}: every floating-point tensor is a broadcast view " \
                       "(a stride of 0): this looks like a weightless architecture, not trained weights " \
                       "(packed as it is; --strict refuses it)\n", r.stderr
    r = run(cli, "pack", "--strict", tmp_path / "arch.pt", "-o", tmp_path / "arch2.tsar", code=3)
    assert "looks like a weightless architecture" in r.stderr and not (tmp_path / "arch2.tsar").exists()
    # One real floating tensor among broadcast ones is a model: no note.
    sd["0.weight"] = torch.randn(8, 3, 3, 3)
    torch.save(sd, tmp_path / "real.pt")
    assert run(cli, "pack", tmp_path / "real.pt", "-o", tmp_path / "real.tsar").stderr == ""
