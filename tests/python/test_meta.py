"""tsar.load_into into modules built on the meta device (torch 2.x): every tensor
becomes a CPU tensor inside the archive's mapping, Parameters stay Parameters
with requires_grad kept, tied weights stay one object, outputs are
bit-identical, and the weights cost no memory of their own. Modules partly on
meta are bound completely or refused unchanged."""
import subprocess
import sys
import textwrap

import pytest
import torch
import torchvision

import tsar
from tsar_testutil import in_mapping, mapped_ranges


def assert_all_in_mapping(module, path):
    ranges = mapped_ranges(path)
    assert ranges, f"{path} is not mapped"
    for name, t in module.state_dict(keep_vars=True).items():
        assert t.device.type == "cpu" and not t.is_meta, f"{name} is on {t.device}"
        if t.numel():
            assert in_mapping(t.data_ptr(), ranges), f"{name} is not inside the archive's mapping"


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    path = str(tmp_path_factory.mktemp("meta") / "r18.tsar")
    tsar.save(model, path)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = model(x)
    return path, x, want


@pytest.mark.parametrize("how", ["context", "to"])
def test_resnet_built_on_meta_gives_the_same_logits(resnet, how):
    path, x, want = resnet
    if how == "context":
        with torch.device("meta"):
            m = torchvision.models.resnet18()
    else:
        m = torchvision.models.resnet18().to("meta")
    m.eval()
    m.layer1[0].conv1.weight.requires_grad_(False)  # one without grad: kept as it was
    report = tsar.load_into(m, path)
    assert len(report.bound) == len(m.state_dict()) and not report.missing
    assert_all_in_mapping(m, path)
    for name, p in m.named_parameters():
        assert isinstance(p, torch.nn.Parameter), name
        assert p.requires_grad == (name != "layer1.0.conv1.weight"), name
    # Buffers stay buffers (BatchNorm's running stats, num_batches_tracked).
    assert {n for n, _ in m.named_buffers()} >= {"bn1.running_mean", "bn1.num_batches_tracked"}
    with torch.no_grad():
        got = m(x)
    assert torch.equal(got, want)


class TiedLM(torch.nn.Module):
    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.block = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, ids):
        return self.head(self.norm(torch.relu(self.block(self.emb(ids))) * self.scale))


def saved_tied_lm(tmp_path, seed):
    """A TiedLM with seeded weights, saved to tmp_path/lm.tsar: (model, path)."""
    torch.manual_seed(seed)
    ref = TiedLM().eval()
    path = str(tmp_path / "lm.tsar")
    tsar.save(ref, path)
    return ref, path


def test_tied_weights_stay_one_parameter(tmp_path):
    ref, path = saved_tied_lm(tmp_path, 1)
    with torch.device("meta"):
        m = TiedLM().eval()
    assert m.head.weight is m.emb.weight
    tsar.load_into(m, path)
    assert m.head.weight is m.emb.weight  # one Parameter object, as before
    assert isinstance(m.emb.weight, torch.nn.Parameter) and m.emb.weight.requires_grad
    assert m.scale.device.type == "cpu" and "scale" in dict(m.named_buffers())
    assert_all_in_mapping(m, path)
    ids = torch.tensor([[1, 2, 3, 49]])
    with torch.no_grad():
        assert torch.equal(m(ids), ref(ids))
    # An optimizer made now holds the bound parameters (deduplicated: one tied).
    assert len(list(m.parameters())) == len(list(ref.parameters()))


def test_partly_on_meta_binds_all_keeping_cpu_parameters_in_place(tmp_path):
    ref, path = saved_tied_lm(tmp_path, 2)
    m = TiedLM().eval()
    m.block.to("meta")
    cpu_param = m.norm.weight  # stays the same object, rebound in place
    tsar.load_into(m, path)
    assert m.norm.weight is cpu_param
    assert not m.block.weight.is_meta and isinstance(m.block.weight, torch.nn.Parameter)
    assert_all_in_mapping(m, path)
    ids = torch.tensor([[4, 5]])
    with torch.no_grad():
        assert torch.equal(m(ids), ref(ids))


def test_meta_tensor_the_archive_lacks_is_refused_even_non_strict(tmp_path):
    torch.manual_seed(3)
    path = str(tmp_path / "small.tsar")
    tsar.save(torch.nn.Linear(4, 3).state_dict(), path)

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(3, 4))  # cpu
            self.bias = torch.nn.Parameter(torch.zeros(3))  # cpu
            self.extra = torch.nn.Linear(2, 2, device="meta")  # not in the archive

    m = Two().eval()
    w = m.weight
    ptr = w.data_ptr()
    with pytest.raises(tsar.Error) as ei:
        tsar.load_into(m, path, strict=False)
    assert ei.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "extra.weight" in str(ei.value) and "meta" in str(ei.value)
    # Nothing changed: the cpu parameters were not rebound, extra is still meta.
    assert m.weight is w and m.weight.data_ptr() == ptr and not m.weight.any()
    assert m.extra.weight.is_meta


def test_meta_strict_mismatch_leaves_the_module_on_meta(tmp_path):
    path = str(tmp_path / "lin.tsar")
    tsar.save(torch.nn.Linear(4, 3).state_dict(), path)
    m = torch.nn.Linear(4, 5, device="meta").eval()
    with pytest.raises(tsar.Error) as ei:
        tsar.load_into(m, path)
    assert "shape [5, 4] vs archive [3, 4]" in str(ei.value)
    assert m.weight.is_meta and m.bias.is_meta


def test_the_weights_cost_no_anonymous_memory(tmp_path):
    """A 256 MiB model built on meta and bound: the process's anonymous memory
    grows by far less than the weights (they are the file's pages)."""
    path = str(tmp_path / "big.tsar")
    torch.manual_seed(4)
    big = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(16)])  # 256 MiB
    tsar.save(big, path)
    del big
    code = textwrap.dedent(f"""
        import torch, tsar
        def anon():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        # torch's one-time costs first: the device context's first use imports
        # modules (33 MiB of them in torch 2.7), whatever the model.
        with torch.device("meta"):
            torch.nn.Linear(2, 2)
        before = anon()
        with torch.device("meta"):
            m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(16)])
        tsar.load_into(m.eval(), {path!r})
        with torch.no_grad():
            y = m(torch.ones(1, 2048))
        print(anon() - before, float(y.sum()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown, _ = out.stdout.split()
    weights = 16 * (2048 * 2048 + 2048) * 4
    assert int(grown) < 0.05 * weights, f"anonymous memory grew {int(grown) >> 20} MiB"



def test_meta_parameters_stay_the_same_objects(tmp_path):
    """The meta TensorImpl becomes a CPU one in place: an optimizer or hook made
    before the bind holds the bound parameter."""
    ref, path = saved_tied_lm(tmp_path, 5)
    with torch.device("meta"):
        m = TiedLM().eval()
    before = {n: p for n, p in m.named_parameters()}
    tsar.load_into(m, path)
    for n, p in m.named_parameters():
        assert p is before[n], n
        assert torch.equal(p, ref.get_parameter(n)), n
