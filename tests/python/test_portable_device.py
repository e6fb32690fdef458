"""Copies onto a device on the portable path (tsar/_portable_device.py): the
accelerator's staging pipeline (python/src/portable_device.h) driven by an
engine over torch's Python API. Where no GPU is, the tests put the synchronous
host engine under "cuda": the plan, the fill from the file or the mapping, the
pieces across buffers and the views rebuilt from the copies are all checked,
only the CUDA calls themselves (streams, events, pinned memory) are not.
tests/python/test_device.py runs on a GPU on both paths."""
import pytest
import torch

import tsar
from tsar import _bind, _portable_device
from tsar_testutil import DTYPES, make_tensor, same_tensor

GPU = torch.cuda.is_available()


class CountingEngine(_portable_device.HostEngine):
    made = []
    instances = []

    def __init__(self, device, sizes, streams, targets=None, locked=None):
        super().__init__(device, sizes, streams, targets, locked)
        if locked is None:  # not a direct lane's
            CountingEngine.made.append((list(sizes), streams))
            CountingEngine.instances.append(self)


@pytest.fixture
def host_engine(monkeypatch):
    """A copy "onto cuda" lands in host memory through the whole pipeline."""
    CountingEngine.made, CountingEngine.instances = [], []
    monkeypatch.setitem(_portable_device.ENGINES, "cuda", CountingEngine)
    monkeypatch.setattr(_bind, "_rest_to", lambda module, device: None)
    return CountingEngine


def _source():
    """Every dtype, a view and a transposed tie of one storage, an empty
    tensor, a parameter that requires grad, and storages larger than the
    small staging buffers the tests ask for."""
    sd = {f"t{i}": make_tensor(d, (33, 7), i) for i, d in enumerate(DTYPES)}
    w = make_tensor(torch.float32, (300, 70), 99)
    sd.update(w=w, w_t=w.t(), w_row=w[5], empty=torch.empty(0, 3),
              big=make_tensor(torch.bfloat16, (1 << 19,), 7),
              p=torch.nn.Parameter(torch.arange(6.0)))
    return sd


def test_state_dict_onto_a_device_arrives_bytes_exact_views_sharing_one_copy(
        portable, host_engine, tmp_path):
    sd = _source()
    tsar.save(sd, tmp_path / "m.tsar")
    with tsar.open(tmp_path / "m.tsar") as a:
        got = a.state_dict(device="cuda", pinned_bytes=1 << 17, buffers=3, fill_threads=2)
        mapped = a.state_dict()
        stats = a.device_stats
        assert list(got) == list(mapped)
        for name, want in sd.items():
            assert same_tensor(got[name], want.detach()) == "", name
            if want.numel():  # a copy, not the mapping
                assert got[name].data_ptr() != mapped[name].data_ptr(), name
        assert got["p"].requires_grad and not got["w"].requires_grad
        storage = got["w"].untyped_storage().data_ptr()
        assert got["w_t"].untyped_storage().data_ptr() == storage
        assert got["w_row"].untyped_storage().data_ptr() == storage
        assert got["t0"].untyped_storage().data_ptr() != storage
        # Each storage copied once: the bytes are the archive's storages'.
        sizes, streams = host_engine.made[0]
        assert stats["bytes"] == sum(sizes) > 1 << 20
        assert len(sizes) == len(sd) - 2  # w_t and w_row are views of w's
        assert stats["bytes_from_file"] == stats["bytes"]  # pread of the file
        assert stats["pinned_bytes"] <= 1 << 17 and stats["fill_threads"] == 2
        assert stats["streams"] == streams == 4 and stats["bytes_direct"] == 0

        got = a.state_dict(device="cuda", pinned_bytes=1 << 16, buffers=1, stage_from="mapping")
        assert a.device_stats["bytes_from_file"] == 0
        assert all(same_tensor(got[n], sd[n].detach()) == "" for n in sd)


def test_a_copy_on_write_archive_arrives_with_the_process_own_writes(
        portable, host_engine, tmp_path):
    tsar.save({"w": torch.zeros(1000)}, tmp_path / "m.tsar")
    with tsar.open(tmp_path / "m.tsar", mode="copy_on_write") as a:
        a["w"][:10] = 7.0  # private memory: the file still holds zeros
        got = a.state_dict(device="cuda")
        assert a.device_stats["bytes_from_file"] == 0
        assert torch.equal(got["w"][:10], torch.full((10,), 7.0))
        assert torch.equal(got["w"][10:], torch.zeros(990))


def test_load_into_a_device_keeps_the_parameter_objects_and_their_ties(
        portable, host_engine, tmp_path):
    def make():
        m = torch.nn.Sequential(torch.nn.Embedding(40, 8), torch.nn.Linear(8, 40, bias=False))
        m[1].weight = m[0].weight
        return m.eval()

    torch.manual_seed(0)
    ref = make()
    tsar.save(ref, tmp_path / "tied.tsar")
    with tsar.open(tmp_path / "tied.tsar") as a:
        mapped = a["0.weight"].data_ptr()
        for meta in (True, False):
            if meta:
                with torch.device("meta"):
                    m = make()
            else:
                m = make()
            p = m[0].weight
            report = tsar.load_into(m, a, device="cuda")
            assert report.bound == ["0.weight", "1.weight"] and report.missing == []
            assert m[0].weight is p and m[1].weight is p and p.requires_grad
            assert torch.equal(p.detach(), ref[0].weight.detach()) and p.data_ptr() != mapped
        assert len(host_engine.made) == 2 and host_engine.made[0][0] == [40 * 8 * 4]


def test_a_rank_of_a_tensor_parallel_archive_copies_its_tensors_onto_the_device(
        portable, host_engine, tmp_path):
    torch.manual_seed(1)
    full = torch.nn.Linear(16, 12).eval()
    tsar.save(full, tmp_path / "tp.tsar", tp=2, shard={"weight": 0})
    for rank in range(2):
        m = torch.nn.Linear(16, 6).eval()
        tsar.load_into(m, tmp_path / "tp.tsar", rank=rank, world=2, device="cuda")
        assert torch.equal(m.weight.detach(), full.weight.detach().chunk(2)[rank])
        assert torch.equal(m.bias.detach(), full.bias.detach().chunk(2)[rank])  # stored whole


def test_a_mismatch_is_refused_before_anything_is_copied(portable, host_engine, tmp_path):
    tsar.save(torch.nn.Linear(4, 4), tmp_path / "m.tsar")
    m = torch.nn.Linear(4, 5).eval()
    before = m.weight.clone()
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, tmp_path / "m.tsar", device="cuda")
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH and "shape [5, 4] vs archive [4, 4]" in str(e.value)
    assert host_engine.made == [] and torch.equal(m.weight, before)


def test_an_engine_that_fails_reaches_the_caller_and_the_next_copy_works(
        portable, monkeypatch, tmp_path):
    class Failing(_portable_device.HostEngine):
        def copy(self, stream, src, target, offset, n):
            if self.copies == 2:
                raise RuntimeError("the device went away")
            super().copy(stream, src, target, offset, n)

    sd = {f"w{i}": torch.full((70000,), float(i)) for i in range(4)}
    tsar.save(sd, tmp_path / "m.tsar")
    with tsar.open(tmp_path / "m.tsar") as a:
        monkeypatch.setitem(_portable_device.ENGINES, "cuda", Failing)
        with pytest.raises(RuntimeError, match="the device went away"):
            a.state_dict(device="cuda", pinned_bytes=1 << 16, buffers=2)
        monkeypatch.setitem(_portable_device.ENGINES, "cuda", _portable_device.HostEngine)
        got = a.state_dict(device="cuda", pinned_bytes=1 << 16, buffers=2)
        assert all(torch.equal(got[n], sd[n]) for n in sd)


def test_staging_options_out_of_range_are_refused_naming_them(portable, host_engine, tmp_path):
    tsar.save({"w": torch.ones(3)}, tmp_path / "m.tsar")
    with tsar.open(tmp_path / "m.tsar") as a:
        with pytest.raises(tsar.Error) as e:
            a.state_dict(device="cuda", buffers=0)
        assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
        assert "expected at least 1 buffer" in str(e.value) and "found 0, 0 and 0" in str(e.value)
        assert host_engine.made == []


def test_a_locked_mapping_is_read_on_a_direct_lane_and_the_rest_staged(
        portable, host_engine, tmp_path):
    """pin="register"'s copy with the lock itself left out (it needs a GPU):
    the pipeline's direct lane reads the mapping through the lane's own
    engine, and a tensor-parallel archive's C-order copies (a weight split
    along dim 1), which lie outside the mapping, are staged."""
    torch.manual_seed(2)
    full = torch.nn.Linear(64, 48).eval()
    for tp, shard in ((0, None), (2, {"weight": 1})):
        path = tmp_path / f"tp{tp}.tsar"
        tsar.save(full, path, **({"tp": tp, "shard": shard} if tp else {}))
        with tsar.open(path) as a:
            impl = a._a()
            locked = (int(impl.data_ptr), int(impl.mapped_size))
            items, stats = _portable_device.to_device(impl, "cuda", "", 1 << 16, 2, 0, 0, True,
                                                      locked)
            got = dict(items)
            assert torch.equal(got["weight"], full.weight.detach())
            assert torch.equal(got["bias"], full.bias.detach())
            assert stats["bytes"] == (64 * 48 + 48) * 4 and stats["streams"] == 1
            lane = host_engine.made and _lanes(host_engine)
            if tp:  # the sharded weight is a host copy: staged; the bias is read directly
                assert stats["bytes_direct"] == 48 * 4 and stats["pinned_bytes"] > 0
            else:
                assert stats["bytes_direct"] == stats["bytes"] and stats["pinned_bytes"] == 0
            assert lane and lane[-1].copies > 0  # the lane's own engine made the direct copies
            with pytest.raises(tsar.Error, match="the locked range is not this archive's mapping"):
                _portable_device.to_device(impl, "cuda", "", 1 << 16, 2, 0, 0, True,
                                           (locked[0] + 4096, 4096))
        CountingEngine.instances.clear()


def _lanes(engine_class):
    return [lane for e in engine_class.instances for lane in e.lanes]


@pytest.mark.skipif(GPU, reason="checks the error where there is no GPU")
def test_without_a_gpu_the_portable_path_says_why(portable, tmp_path):
    tsar.save({"w": torch.ones(3)}, tmp_path / "m.tsar")
    with tsar.open(tmp_path / "m.tsar") as a:
        for call in (lambda: a.state_dict(device="cuda"),
                     lambda: tsar.load_into(torch.nn.Linear(2, 2).eval(), a, device="cuda:0")):
            with pytest.raises(tsar.Error) as e:
                call()
            assert e.value.code == tsar.ErrorCode.UNSUPPORTED
            assert "no CUDA device/driver is present" in str(e.value)
        with pytest.raises(tsar.Error, match='pin="register" needs a CUDA device'):
            a.state_dict(device="cuda", pin="register")
        assert a.registration_seconds is None and a.device_stats is None
        with pytest.raises(tsar.Error, match="only cpu and cuda devices are supported, found mps"):
            a.state_dict(device="mps")
