"""torchvision models: save, bind into a freshly initialised model, same output bit for bit."""
import pytest
import torch
import torchvision

import tsar
from tsar_testutil import all_parameters, in_mapping, mapped_ranges, same_tensor

MODELS = {
    "resnet18": lambda: torchvision.models.resnet18(weights=None),
    "mobilenet_v3_small": lambda: torchvision.models.mobilenet_v3_small(weights=None),
    "squeezenet1_0": lambda: torchvision.models.squeezenet1_0(weights=None),
}


def build(name, seed):
    torch.manual_seed(seed)
    return MODELS[name]().eval()


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("source", ["path", "archive"])
def test_load_into_gives_bit_identical_output(tmp_path, name, source):
    original = build(name, seed=0)
    # BatchNorm running stats that are not 0/1, so that buffers matter to the output.
    with torch.no_grad():
        for mod in original.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.9, 1.1)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = original(x)
    path = str(tmp_path / f"{name}.tsar")
    tsar.save(original, path)

    fresh = build(name, seed=1)
    with torch.no_grad():
        assert not torch.equal(fresh(x), want), "a different init must give a different output"
    params_before = all_parameters(fresh)
    ids_before = {n: id(p) for n, p in params_before.items()}
    grad_before = {n: p.requires_grad for n, p in params_before.items()}

    if source == "path":
        report = tsar.load_into(fresh, path)
    else:
        with tsar.open(path) as archive:
            report = tsar.load_into(fresh, archive)
    assert isinstance(report, tuple)
    assert report._fields == ("bound", "missing", "unexpected", "mismatched", "tied")
    assert sorted(report.bound) == sorted(fresh.state_dict().keys())
    assert report.missing == [] and report.unexpected == [] and report.mismatched == []

    with torch.no_grad():
        got = fresh(x)
    assert torch.equal(got, want)

    params_after = all_parameters(fresh)
    assert {n: id(p) for n, p in params_after.items()} == ids_before
    assert {n: p.requires_grad for n, p in params_after.items()} == grad_before
    assert all(isinstance(p, torch.nn.Parameter) for p in params_after.values())
    ranges = mapped_ranges(path)
    assert ranges, "the archive is not mapped in this process"
    for n, t in fresh.state_dict().items():
        assert in_mapping(t.data_ptr(), ranges), f"{n} does not point into the archive mapping"
    for n, t in original.state_dict().items():
        assert same_tensor(fresh.state_dict()[n], t) == "", n
