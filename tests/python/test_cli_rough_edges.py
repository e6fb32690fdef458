"""What a new user of the command line runs into (issue 12): totals and aligned
columns in `tsar inspect`, inputs of `tsar pack` named as such, ..."""
import json
import re

import pytest
import torch

import tsar
from tsar_testutil import run_cli as run


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10))


@pytest.mark.tsar_torch
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


@pytest.mark.tsar_torch
def test_diff_of_a_state_dict_and_torchscript_values_only(cli, tmp_path):
    net = small_net().eval()
    torch.save(net.state_dict(), tmp_path / "sd.pt")
    torch.jit.script(net).save(str(tmp_path / "ts.pt"))
    run(cli, "pack", "-q", tmp_path / "sd.pt", "-o", tmp_path / "sd.tsar")
    run(cli, "pack", "-q", tmp_path / "ts.pt", "-o", tmp_path / "ts.tsar")
    r = run(cli, "diff", tmp_path / "sd.tsar", tmp_path / "ts.tsar", code=1)
    assert "role tensor -> parameter; requires_grad false -> true" in r.stdout
    r = run(cli, "diff", "--values-only", tmp_path / "sd.tsar", tmp_path / "ts.tsar")
    assert r.stdout.startswith("same: ")


def test_diff_counts_differing_elements_and_the_largest_difference(cli, tmp_path):
    torch.manual_seed(1)
    a = {"f32": torch.randn(100), "f16": torch.randn(50).half(), "bf16": torch.randn(40).bfloat16(),
         "f64": torch.randn(30).double(), "c64": torch.randn(20, dtype=torch.complex64),
         "i64": torch.arange(10), "u8": torch.arange(10, dtype=torch.uint8), "b": torch.ones(8, dtype=torch.bool),
         "zero": torch.zeros(4), "nan": torch.tensor([float("nan"), 1.0]),
         "t": torch.randn(6, 5).t(), "bcast": torch.ones(1).expand(1000)}
    b = {k: v.clone() for k, v in a.items()}
    b["f32"][[3, 50]] += torch.tensor([1e-3, -2.5])
    b["f16"][7] += 0.5
    b["bf16"][0] = -b["bf16"][0] - 1
    b["f64"][29] += 1e-12
    b["c64"][2] += 3 + 4j
    b["i64"][9] = -100
    b["u8"][0] = 255
    b["b"][5] = False
    b["zero"][1] = -0.0
    b["nan"][1] = float("nan")
    b["t"] = a["t"].contiguous()  # same values, other layout
    b["bcast"] = torch.full((1,), 3.0).expand(1000)
    tsar.save(a, tmp_path / "a.tsar")
    tsar.save(b, tmp_path / "b.tsar")
    doc = json.loads(run(cli, "diff", "--json", tmp_path / "a.tsar", tmp_path / "b.tsar", code=1).stdout)
    got = {c["name"].split("/")[1]: c for c in doc["changed"]}
    expect = {}
    for k in a:
        x, y = a[k], b[k]
        if k in ("t",):
            continue
        if x.is_complex() or x.is_floating_point():
            dx = (x.double() if not x.is_complex() else x.to(torch.complex128)) - \
                 (y.double() if not y.is_complex() else y.to(torch.complex128))
            expect[k] = dx.abs()
        else:
            expect[k] = (x.long() - y.long()).abs().double()
    assert "t" not in got  # a transpose made contiguous has the same values
    for k, diff in expect.items():
        if k == "zero":  # 0.0 against -0.0: bytes differ, values do not
            assert got[k]["differing_elements"] == 1 and got[k]["max_abs_diff"] == 0.0
            continue
        if k == "nan":  # a NaN against a number: counted, and the largest difference is unknown
            assert got[k]["differing_elements"] == 1 and got[k]["max_abs_diff"] is None
            continue
        n = int((diff != 0).sum())
        assert got[k]["differing_elements"] == n, (k, got[k])
        assert got[k]["elements"] == a[k].numel()
        assert got[k]["max_abs_diff"] == float(diff.max()), (k, got[k], float(diff.max()))
    text = run(cli, "diff", tmp_path / "a.tsar", tmp_path / "b.tsar", code=1).stdout
    assert "changed model/f32: 2 of 100 elements differ, max |a - b| 2.5\n" in text, text
    assert "changed model/f16: 1 of 50 elements differs, max |a - b| 0.5\n" in text, text
    assert "changed model/bcast: 1000 of 1000 elements differ, max |a - b| 2\n" in text, text
    # Tolerances: |a - b| <= atol + rtol * |b| for floating point; integers stay exact.
    doc = json.loads(run(cli, "diff", "--json", "--atol", "0.01", tmp_path / "a.tsar", tmp_path / "b.tsar",
                         code=1).stdout)
    got = {c["name"].split("/")[1]: c for c in doc["changed"]}
    assert "f64" not in got and "zero" not in got
    assert got["f32"]["differing_elements"] == 1 and abs(got["f32"]["max_abs_diff"] - 2.5) < 1e-6
    assert got["i64"]["differing_elements"] == 1 and got["u8"]["differing_elements"] == 1
    doc = json.loads(run(cli, "diff", "--json", "--rtol", "10", tmp_path / "a.tsar", tmp_path / "b.tsar",
                         code=1).stdout)
    beyond = {k for k in expect if (a[k].is_floating_point() or a[k].is_complex()) and k not in ("nan", "zero")
              and bool((expect[k] > 10 * b[k].to(expect[k].dtype if not b[k].is_complex() else torch.complex128)
                        .abs()).any())}
    assert {c["name"].split("/")[1] for c in doc["changed"]} == {"i64", "u8", "b", "nan"} | beyond
    run(cli, "diff", "--atol", "-1", tmp_path / "a.tsar", tmp_path / "b.tsar", code=2)


@pytest.mark.tsar_torch
def test_pack_selects_entries_and_strips_a_prefix(cli, tmp_path):
    net = small_net()
    ddp = {"module." + k: v for k, v in net.state_dict().items()}  # what DDP's state_dict() names
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    torch.save({"model": ddp, "optimizer": opt.state_dict(), "epoch": 3}, tmp_path / "ckpt.pt")
    r = run(cli, "pack", tmp_path / "ckpt.pt", "--only", "model", "--strip-prefix", "module.",
            "-o", tmp_path / "m.tsar")
    assert "not the rest of the checkpoint's structure" in r.stderr
    with tsar.open(tmp_path / "m.tsar") as a:
        assert a.entries == ["model"]
        sd = a.state_dict("model")
        assert list(sd) == list(net.state_dict())
        for k, v in net.state_dict().items():
            assert torch.equal(sd[k], v), k
        assert a.metadata()["epoch"] == 3
    # The packed state_dict binds into the plain model.
    fresh = small_net().eval()
    tsar.load_into(fresh, tmp_path / "m.tsar")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), net.state_dict().values()))
    r = run(cli, "pack", tmp_path / "ckpt.pt", "--exclude", "model", "-o", tmp_path / "o.tsar")
    with tsar.open(tmp_path / "o.tsar") as a:
        assert "model" not in a.entries and any(e.startswith("optimizer") for e in a.entries)
    # Names as the archive has them: an --entry name prefixes the file's entries first.
    run(cli, "pack", "-q", "--entry", f"ck={tmp_path / 'ckpt.pt'}", "--only", "ck.model",
        "-o", tmp_path / "ck.tsar")
    with tsar.open(tmp_path / "ck.tsar") as a:
        assert a.entries == ["ck.model"]
    r = run(cli, "pack", tmp_path / "ckpt.pt", "--only", "modle", "-o", tmp_path / "x.tsar", code=2)
    assert "--only modle: no input has an entry of that name (the entries are " in r.stderr
    assert '"model"' in r.stderr and not (tmp_path / "x.tsar").exists()
    r = run(cli, "pack", tmp_path / "ckpt.pt", "--strip-prefix", "modul.", "-o", tmp_path / "x.tsar", code=2)
    assert '--strip-prefix "modul.": no tensor name starts with it' in r.stderr
    # Without selection, the prefix is stripped and the checkpoint's structure kept.
    run(cli, "pack", "-q", tmp_path / "ckpt.pt", "--strip-prefix", "module.", "-o", tmp_path / "all.tsar")
    back = tmp_path / "back.pt"
    run(cli, "export", "-q", tmp_path / "all.tsar", "-o", back)
    loaded = torch.load(back)
    assert list(loaded["model"]) == list(net.state_dict()) and loaded["epoch"] == 3
    assert loaded["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]


def test_inspect_and_diff_escape_control_characters_in_names(cli, tmp_path):
    # A hostile archive's names must not reach the terminal raw (cursor moves,
    # screen clears, title changes): control characters come out as \xNN.
    evil = "w\x1b[2J\x07\u009b"
    tsar.save({evil: torch.ones(2), "ok": torch.zeros(1)}, tmp_path / "a.tsar", metadata={"k\x1b]0;t": 1})
    tsar.save({"ok": torch.zeros(1)}, tmp_path / "b.tsar")
    text = run(cli, "inspect", tmp_path / "a.tsar").stdout
    assert "\x1b" not in text and "\x07" not in text and "\u009b" not in text
    assert "w\\x1b[2J\\x07\\u009b" in text and "k\\x1b]0;t = 1 (int)" in text, text
    diff = run(cli, "diff", tmp_path / "a.tsar", tmp_path / "b.tsar", code=1).stdout
    assert "\x1b" not in diff and "removed model/w\\x1b[2J" in diff, diff
    # JSON keeps the names exactly (its own escaping).
    doc = json.loads(run(cli, "inspect", "--json", tmp_path / "a.tsar").stdout)
    assert evil in [t["name"] for t in doc["tensors"]]
