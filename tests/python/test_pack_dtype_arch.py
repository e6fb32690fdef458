"""`tsar pack --dtype` (floating tensors stored as another dtype, sharing kept)
and `tsar pack --arch` (a TorchScript architecture without its weight bytes,
LSTM included), with their Python forms; `tsar.load_into`'s name prefixes."""
import os

import pytest
import torch

import tsar
from tsar_testutil import run_cli as run


def mixed_state_dict():
    torch.manual_seed(0)
    base = torch.randn(6, 4)
    raw = torch.randn(8)
    return {
        "w": torch.nn.Parameter(torch.randn(5, 3)),  # requires_grad, role parameter
        "d": torch.randn(7, dtype=torch.float64),
        "h": torch.randn(3, dtype=torch.float16),
        "base": base,
        "base_t": base.t(),  # a view: one storage with base
        "tail": base[2:],  # a view at an offset
        "idx": torch.arange(5),
        "mask": torch.tensor([True, False]),
        "c": torch.randn(2, dtype=torch.complex64),
        "raw": raw,
    }


def test_dtype_converts_floating_tensors_and_keeps_sharing(cli, tmp_path):
    sd = mixed_state_dict()
    torch.save(sd, tmp_path / "sd.pt")
    r = run(cli, "pack", tmp_path / "sd.pt", "--dtype", "bfloat16", "-o", tmp_path / "bf.tsar")
    note = [line for line in r.stderr.splitlines() if "dtype bfloat16" in line]
    assert len(note) == 1, r.stderr
    assert "converted 7 floating-point tensors in 5 storages (from float16: 1, float32: 5, float64: 1)" \
        in note[0], note[0]
    # torch.save cannot hold one storage seen with two dtypes; tsar.save can.
    sd["raw_bits"] = sd["raw"].view(torch.int32)
    tsar.save(sd, tmp_path / "mixed.tsar", dtype=torch.bfloat16)
    with tsar.open(tmp_path / "mixed.tsar") as a:
        assert a["raw"].dtype == torch.float32 and torch.equal(a["raw_bits"], sd["raw_bits"])
        assert a["raw_bits"].storage().data_ptr() == a["raw"].storage().data_ptr()
        assert a["base"].dtype == torch.bfloat16
    del sd["raw_bits"]
    with tsar.open(tmp_path / "bf.tsar") as a:
        got = a.state_dict()
        for name in ["w", "d", "h", "base", "base_t", "tail", "raw"]:
            assert got[name].dtype == torch.bfloat16, name
            assert torch.equal(got[name], sd[name].detach().to(torch.bfloat16)), name
        for name in ["idx", "mask", "c"]:
            assert got[name].dtype == sd[name].dtype and torch.equal(got[name], sd[name]), name
        # Views of one storage still are: same storage, same element offsets and strides.
        assert got["base_t"].storage().data_ptr() == got["base"].storage().data_ptr()
        assert got["tail"].storage().data_ptr() == got["base"].storage().data_ptr()
        assert got["tail"].storage_offset() == 8 and got["base_t"].stride() == (1, 4)
        infos = {i.name: i for i in a.infos()}
        assert infos["w"].role == "parameter" and got["w"].requires_grad


def test_dtype_is_refused_for_other_names_and_matches_python_save(cli, tmp_path):
    sd = {"a": torch.randn(4, 4), "b": torch.arange(3)}
    torch.save(sd, tmp_path / "sd.pt")
    r = run(cli, "pack", tmp_path / "sd.pt", "--dtype", "int8", "-o", tmp_path / "x.tsar", code=2)
    assert "--dtype" in r.stderr and "float16" in r.stderr
    assert not (tmp_path / "x.tsar").exists()
    run(cli, "pack", "-q", tmp_path / "sd.pt", "--dtype", "float16", "-o", tmp_path / "cli.tsar")
    tsar.save(sd, tmp_path / "py.tsar", dtype=torch.float16)
    summary = tsar.pack(tmp_path / "sd.pt", tmp_path / "pack.tsar", dtype=torch.float16)
    assert any("dtype float16: converted 1 floating-point tensor in 1 storage" in n for n in summary.notes)
    assert (tmp_path / "cli.tsar").read_bytes() == (tmp_path / "pack.tsar").read_bytes()
    for path in ["cli.tsar", "py.tsar"]:
        with tsar.open(tmp_path / path) as a:
            assert a["a"].dtype == torch.float16 and torch.equal(a["a"], sd["a"].half())
            assert a["b"].dtype == torch.int64
    with pytest.raises(ValueError, match="float16"):
        tsar.save(sd, tmp_path / "bad.tsar", dtype=torch.int32)
    # Already the dtype asked for: the same bytes as without --dtype.
    run(cli, "pack", "-q", tmp_path / "sd.pt", "--dtype", "float32", "-o", tmp_path / "same.tsar")
    run(cli, "pack", "-q", tmp_path / "sd.pt", "-o", tmp_path / "plain.tsar")
    assert (tmp_path / "same.tsar").read_bytes() == (tmp_path / "plain.tsar").read_bytes()


class Recurrent(torch.nn.Module):
    """Conv, BatchNorm, a 2-layer LSTM (its weights are also held in the
    _flat_weights list) and two heads with a tied weight."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3)
        self.bn = torch.nn.BatchNorm2d(16)
        self.lstm = torch.nn.LSTM(16, 128, num_layers=2, batch_first=True)
        self.fc = torch.nn.Linear(128, 8)
        self.head = torch.nn.Linear(128, 8)
        self.head.weight = self.fc.weight

    def forward(self, x):
        y = self.bn(self.conv(x)).mean(dim=(2, 3))
        o, _ = self.lstm(y.unsqueeze(1).repeat(1, 4, 1))
        return self.fc(o[:, -1]) + self.head(o[:, -1])


@pytest.mark.tsar_torch
def test_arch_writes_the_torchscript_architecture_without_weights(cli, tmp_path):
    torch.manual_seed(0)
    model = Recurrent().eval()
    with torch.no_grad():  # running stats other than the defaults
        model.bn.running_mean.uniform_()
        model.bn.running_var.uniform_(0.5, 2)
    torch.jit.script(model).save(str(tmp_path / "m_ts.pt"))
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        want = model(x)
    run(cli, "pack", tmp_path / "m_ts.pt", "-o", tmp_path / "m.tsar", "--arch", tmp_path / "m_arch.pt")
    run(cli, "pack", "-q", tmp_path / "m_ts.pt", "-o", tmp_path / "plain.tsar")
    assert (tmp_path / "m.tsar").read_bytes() == (tmp_path / "plain.tsar").read_bytes()
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert weights > 500_000
    assert os.path.getsize(tmp_path / "m_arch.pt") < os.path.getsize(tmp_path / "m_ts.pt") - 0.95 * weights
    arch = torch.jit.load(str(tmp_path / "m_arch.pt")).eval()
    assert [n for n, _ in arch.named_parameters()] == [n for n, _ in model.named_parameters()]
    for name, t in arch.state_dict().items():
        ref = model.state_dict()[name]
        assert (t.shape, t.dtype) == (ref.shape, ref.dtype), name
        assert t.numel() <= 1 or set(t.stride()) == {0}, name
    assert arch.lstm._flat_weights[0] is arch.lstm.weight_ih_l0  # one object, as in the input
    with torch.no_grad():
        assert not torch.equal(arch(x), want)
    report = tsar.load_into(arch, tmp_path / "m.tsar")
    assert report.missing == [] and report.unexpected == []
    with torch.no_grad():
        assert torch.equal(arch(x), want)  # the LSTM's _flat_weights see the archive too
    # The Python form writes the same two files (TorchScript names its records
    # after the file, so the same name in another directory).
    os.mkdir(tmp_path / "py")
    tsar.pack(tmp_path / "m_ts.pt", tmp_path / "py" / "m.tsar", arch=tmp_path / "py" / "m_arch.pt")
    assert (tmp_path / "py" / "m.tsar").read_bytes() == (tmp_path / "m.tsar").read_bytes()
    assert (tmp_path / "py" / "m_arch.pt").read_bytes() == (tmp_path / "m_arch.pt").read_bytes()


@pytest.mark.tsar_torch
def test_arch_needs_one_torchscript_input_and_writes_nothing_otherwise(cli, tmp_path):
    torch.save(Recurrent().state_dict(), tmp_path / "sd.pt")
    r = run(cli, "pack", tmp_path / "sd.pt", "-o", tmp_path / "m.tsar", "--arch", tmp_path / "a.pt", code=2)
    assert "sd.pt: --arch: this is a torch.save file" in r.stderr and "TorchScript" in r.stderr
    r = run(cli, "pack", tmp_path / "sd.pt", tmp_path / "sd.pt", "-o", tmp_path / "m.tsar",
            "--arch", tmp_path / "a.pt", code=2)
    assert "--arch: expected one input, a TorchScript file, found 2" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["sd.pt"]


def test_load_into_matches_names_by_prefix(tmp_path):
    torch.manual_seed(0)
    plain = torch.nn.Linear(3, 2)
    ddp = {"module." + k: v for k, v in plain.state_dict().items()}
    tsar.save(ddp, tmp_path / "ddp.tsar")
    target = torch.nn.Linear(3, 2).eval()
    report = tsar.load_into(target, tmp_path / "ddp.tsar", archive_prefix="module.")
    assert sorted(report.bound) == ["bias", "weight"]
    assert torch.equal(target.weight, plain.weight)

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Linear(3, 2)

    tsar.save(plain, tmp_path / "plain.tsar")
    wrapped = Wrapper().eval()
    report = tsar.load_into(wrapped, tmp_path / "plain.tsar", module_prefix="model.")
    assert sorted(report.bound) == ["model.bias", "model.weight"]
    assert torch.equal(wrapped.model.bias, plain.bias)
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(Wrapper().eval(), tmp_path / "plain.tsar")
    assert "model.weight" in str(e.value)
