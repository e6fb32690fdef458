"""Archives on a GPU (issue 29): Archive.state_dict(device=), load_into(device=).
Without a GPU the GPU tests skip, saying so, and the error is checked."""
import pytest
import torch

import tsar
from tsar_testutil import DTYPES, bits

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device here: the GPU path is built and linked, "
                               "not run")


def _source():
    torch.manual_seed(0)
    sd = {f"t_{str(d).split('.')[-1]}": torch.randn(4, 8).to(d) if d.is_floating_point
          else torch.randint(0, 100, (4, 8)).to(d) for d in DTYPES
          if d not in (torch.float4_e2m1fn_x2, torch.complex32, torch.complex64, torch.complex128,
                       torch.bool, torch.uint16, torch.uint32, torch.uint64)}
    sd["emb"] = torch.randn(16, 8)
    sd["head"] = sd["emb"]
    sd["part"] = sd["emb"][2:6]
    return sd


@pytest.mark.skipif(GPU, reason="checks the error where there is no GPU")
def test_without_a_gpu_device_is_refused_saying_why(tmp_path):
    tsar.save(_source(), tmp_path / "m.tsar")
    a = tsar.open(tmp_path / "m.tsar")
    with pytest.raises(tsar.Error, match="no CUDA device/driver is present"):
        a.state_dict(device="cuda")
    assert a.state_dict(device="cpu").keys() == a.state_dict().keys()
    with pytest.raises(tsar.Error, match="no CUDA device/driver"):
        tsar.load_into(torch.nn.Linear(2, 2).eval(), a, device="cuda:0")


@needs_gpu
@pytest.mark.parametrize("pinned", [64 << 10, 64 << 20])
def test_every_storage_arrives_bytes_exact_with_ties_as_views(tmp_path, pinned):
    sd = _source()
    tsar.save(sd, tmp_path / "m.tsar")
    got = tsar.open(tmp_path / "m.tsar").state_dict(device="cuda", pinned_bytes=pinned)
    for name, want in sd.items():
        g = got[name]
        assert g.is_cuda and g.dtype == want.dtype and g.shape == want.shape, name
        assert torch.equal(bits(g.cpu()), bits(want)), name
    assert got["emb"].untyped_storage().data_ptr() == got["head"].untyped_storage().data_ptr()
    assert got["part"].untyped_storage().data_ptr() == got["emb"].untyped_storage().data_ptr()


@needs_gpu
def test_a_meta_module_and_a_tensor_parallel_archive_load_onto_the_gpu(tmp_path):
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    tsar.save(ref, tmp_path / "tp.tsar", tp=2, shard={"0.weight": 0, "2.weight": 1})
    with torch.device("meta"):
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    tsar.load_into(m, tmp_path / "tp.tsar", device="cuda")
    x = torch.randn(3, 16)
    torch.testing.assert_close(m(x.cuda()).cpu(), ref(x))
