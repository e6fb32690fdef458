"""tsar.load_into: strict errors, non-strict reports, training-mode refusal."""
import pytest
import torch

import tsar
from tsar_testutil import in_mapping, mapped_ranges


class Saved(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.out = torch.nn.Linear(3, 2)
        self.register_buffer("extra", torch.ones(5))


class Other(torch.nn.Module):
    """Against Saved: fc.bias has another dtype, out another shape, `lost` is not
    in the archive, and the archive's `extra` is not in this module."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.fc.bias = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        self.out = torch.nn.Linear(3, 5)
        self.lost = torch.nn.Linear(2, 2)


def snapshot(m):
    return {n: (t.data_ptr(), t.detach().clone()) for n, t in m.state_dict().items()}


def assert_unchanged(m, snap):
    now = m.state_dict()
    assert set(now) == set(snap)
    for n, (ptr, values) in snap.items():
        assert now[n].data_ptr() == ptr, f"{n} was rebound"
        assert torch.equal(now[n], values), f"{n} changed"


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    path = str(tmp_path / "saved.tsar")
    tsar.save(Saved().eval(), path)
    return path


def test_strict_lists_every_problem_in_one_error(saved):
    torch.manual_seed(1)
    m = Other().eval()
    snap = snapshot(m)
    with pytest.raises(tsar.Error) as ei:
        tsar.load_into(m, saved)
    e = ei.value
    assert e.code == tsar.ErrorCode.BIND_MISMATCH
    msg = str(e)
    for name in ["lost.weight", "lost.bias", "extra", "out.weight", "out.bias", "fc.bias"]:
        assert name in msg, f"{name} not named in: {msg}"
    assert_unchanged(m, snap)


def test_non_strict_binds_what_matches_and_reports_the_rest(saved):
    torch.manual_seed(1)
    m = Other().eval()
    snap = snapshot(m)
    report = tsar.load_into(m, saved, strict=False)
    assert report.bound == ["fc.weight"]
    assert sorted(report.missing) == ["lost.bias", "lost.weight"]
    assert report.unexpected == ["extra"]
    assert sorted(s.split(":")[0] for s in report.mismatched) == ["fc.bias", "out.bias", "out.weight"]
    ranges = mapped_ranges(saved)
    assert in_mapping(m.fc.weight.data_ptr(), ranges)
    with tsar.open(saved) as a:
        assert torch.equal(m.fc.weight, a["fc.weight"])
    for n in ["fc.bias", "out.weight", "out.bias", "lost.weight", "lost.bias"]:
        ptr, values = snap[n]
        assert m.state_dict()[n].data_ptr() == ptr and torch.equal(m.state_dict()[n], values), n


def test_strict_success_report(saved):
    torch.manual_seed(2)
    m = Saved().eval()
    report = tsar.load_into(m, saved)
    assert sorted(report.bound) == ["extra", "fc.bias", "fc.weight", "out.bias", "out.weight"]
    assert (report.missing, report.unexpected, report.mismatched) == ([], [], [])


class WithBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x))


@pytest.fixture
def bn_archive(tmp_path):
    torch.manual_seed(0)
    path = str(tmp_path / "bn.tsar")
    tsar.save(WithBN().eval(), path)
    return path


@pytest.mark.parametrize("which", ["module", "submodule"])
def test_training_mode_over_shared_is_refused(bn_archive, which):
    m = WithBN()
    if which == "module":
        m.train()
    else:
        m.eval()
        m.bn.train()
    snap = snapshot(m)
    with pytest.raises(tsar.Error) as ei:
        tsar.load_into(m, bn_archive)
    assert ei.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert_unchanged(m, snap)
    with tsar.open(bn_archive) as a, pytest.raises(tsar.Error) as ei:
        tsar.load_into(m, a)
    assert ei.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert_unchanged(m, snap)


def test_allow_training_binds(bn_archive):
    m = WithBN().train()
    report = tsar.load_into(m, bn_archive, allow_training=True)
    assert len(report.bound) == 7 and m.training
    assert in_mapping(m.bn.running_mean.data_ptr(), mapped_ranges(bn_archive))


@pytest.mark.parametrize("mode", ["copy_on_write", "read"])
def test_training_over_a_private_archive_works(bn_archive, mode):
    before = open(bn_archive, "rb").read()
    m = WithBN().train()
    a = tsar.open(bn_archive, mode=mode)
    report = tsar.load_into(m, a)
    assert len(report.bound) == 7
    mean0 = m.bn.running_mean.clone()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    loss = m(torch.randn(8, 4, generator=torch.Generator().manual_seed(3))).pow(2).sum()
    loss.backward()
    opt.step()
    assert not torch.equal(m.bn.running_mean, mean0), "BatchNorm in train() updates its buffer in place"
    assert m.bn.num_batches_tracked.item() == 1
    with tsar.open(bn_archive) as fresh:
        assert not torch.equal(m.fc.weight.detach(), fresh["fc.weight"]), "the step changed the weights"
    assert open(bn_archive, "rb").read() == before, "training must never change the file"


def test_entry_selects_the_state_dict(tmp_path):
    torch.manual_seed(0)
    a, b = Saved().eval(), Saved().eval()
    path = str(tmp_path / "two.tsar")
    tsar.save({"model": a.state_dict(), "ema": b.state_dict()}, path)
    m = Saved().eval()
    tsar.load_into(m, path, entry="ema")
    for n, t in b.state_dict().items():
        assert torch.equal(m.state_dict()[n], t), n
    tsar.load_into(m, path)  # the first entry
    for n, t in a.state_dict().items():
        assert torch.equal(m.state_dict()[n], t), n
    with pytest.raises(tsar.Error) as ei:
        tsar.load_into(m, path, entry="nope")
    assert ei.value.code == tsar.ErrorCode.NOT_FOUND


def test_the_module_walk_lists_what_state_dict_lists(tmp_path):
    """load_into walks the module tree itself (tsar._module_state.state_items): the same
    names, tensor objects and order as state_dict(keep_vars=True), and whether any
    submodule trains; modules with hooks or their own state_dict logic fall back.
    Where the accelerator runs, its C++ walk (_tsar.module_slots) too."""
    import torchvision
    from tsar import _backend
    from tsar._module_state import PLAIN, plain, state_items

    accelerator = _backend.accelerator  # tsar._tsar, or None on the portable path

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.register_parameter("gone", None)  # None: not in state_dict
            self.register_buffer("scratch", torch.zeros(2), persistent=False)
            self.register_buffer("kept", torch.ones(2))
            self.register_buffer("empty", None)
            self.seq = torch.nn.Sequential(torch.nn.BatchNorm1d(2), torch.nn.Identity())
            self.tied = self.lin  # one module under two names
            self.skip = None

    class Custom(torch.nn.Linear):
        def _save_to_state_dict(self, destination, prefix, keep_vars):
            destination[prefix + "renamed"] = self.weight

    def check(m, want_training, c_walks=True):
        items, training, loose = state_items(m)
        assert loose == []  # no non-persistent buffer on meta here
        want = list(m.state_dict(keep_vars=True).items())
        assert [n for n, _ in items] == [n for n, _ in want]
        assert all(a is b for (_, a), (_, b) in zip(items, want))
        assert training == want_training
        if accelerator is None:
            return
        # The C++ walk load_into tries first: the same, or None where
        # state_dict() must run itself.
        walked = accelerator.module_slots(m, PLAIN, plain)
        if not c_walks:
            assert walked is None
            return
        names, tensors, training = walked
        assert names == [n for n, _ in want]
        assert len(tensors) == len(want) and all(a is b for a, (_, b) in zip(tensors, want))
        assert training == want_training

    check(torchvision.models.resnet18().eval(), False)
    m = Odd().eval()
    check(m, False)
    m.seq[1].train()  # one submodule training is enough
    check(m, True)
    custom = torch.nn.Sequential(Custom(2, 2)).eval()
    check(custom, False, c_walks=False)
    assert "0.renamed" in [n for n, _ in state_items(custom)[0]]
    hooked = torch.nn.Sequential(torch.nn.Linear(2, 2)).eval()
    hooked[0]._register_state_dict_hook(lambda mod, sd, prefix, local: sd.pop(prefix + "bias"))
    check(hooked, False, c_walks=False)
    assert [n for n, _ in state_items(hooked)[0]] == ["0.weight"]
    pre = torch.nn.Sequential(torch.nn.Linear(2, 2)).eval()
    pre[0].register_state_dict_pre_hook(lambda mod, prefix, keep_vars: None)
    check(pre, False, c_walks=False)
    # load_into through either walk binds the same: the hooked module falls back.
    path = tmp_path / "hooked.tsar"
    tsar.save(torch.nn.Sequential(torch.nn.Linear(2, 2)), path)
    assert tsar.load_into(hooked, path, strict=False).bound == ["0.weight"]
    assert tsar.load_into(m.eval(), str(path), strict=False).bound == []  # either path's C++ walk


def test_a_module_that_contains_itself_is_refused_not_walked_forever(tmp_path):
    """A cycle in the module graph (state_dict() raises RecursionError on it):
    the C++ walk declines past Python's nesting limit and the Python walk
    refuses with the path, where both once walked until memory ran out."""
    path = tmp_path / "m.tsar"
    tsar.save(torch.nn.Sequential(torch.nn.Linear(2, 2)), path)
    m = torch.nn.Sequential(torch.nn.Linear(2, 2)).eval()
    before, ptr = m[0].weight.detach().clone(), m[0].weight.data_ptr()
    m.add_module("again", m)
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, path, strict=False)
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert "more than 1000 levels deep at 'again.again." in str(e.value)
    assert "contains itself" in str(e.value) and "Nothing was changed" in str(e.value)
    assert m[0].weight.data_ptr() == ptr and torch.equal(m[0].weight, before)  # unchanged


class _WithExtraState(torch.nn.Module):
    """A module with extra state: state_dict() holds a non-tensor under
    '_extra_state' (as TransformerEngine's layers do)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.state = {"scale": 2}

    def get_extra_state(self):
        return self.state

    def set_extra_state(self, state):
        self.state = state


def test_extra_state_is_refused_by_save_and_left_alone_by_load_into(tmp_path):
    """Both once failed with a raw TypeError or AttributeError from deep
    inside (a dict where a tensor was expected)."""
    m = torch.nn.Sequential(_WithExtraState()).eval()
    assert "0._extra_state" in m.state_dict()
    with pytest.raises(TypeError) as e:
        tsar.save(m, tmp_path / "no.tsar")
    assert "'0._extra_state', a dict, not a Tensor" in str(e.value)
    assert "extra state" in str(e.value) and "isinstance(v, torch.Tensor)" in str(e.value)
    assert not (tmp_path / "no.tsar").exists()
    # The tensors saved as the message says, then bound: strict, the extra
    # state neither missing nor touched.
    path = tmp_path / "m.tsar"
    tsar.save({k: v for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)}, path)
    for meta in (False, True):
        with torch.device("meta" if meta else "cpu"):
            fresh = torch.nn.Sequential(_WithExtraState()).eval()
        fresh[0].state = {"scale": 3}
        report = tsar.load_into(fresh, path)
        assert sorted(report.bound) == ["0.lin.bias", "0.lin.weight"] and report.missing == []
        assert fresh[0].state == {"scale": 3}
        assert torch.equal(fresh[0].lin.weight, m[0].lin.weight)
        assert in_mapping(fresh[0].lin.weight.data_ptr(), mapped_ranges(path))
