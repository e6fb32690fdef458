"""save -> open keeps every dtype, shape, stride and bit; 0-d, empty and
non-contiguous tensors; roles and requires_grad."""
import os

import pytest
import torch

import tsar
from tsar_testutil import DTYPES, make_tensor, reference_decoder, same_tensor


def layouts(dtype):
    """name -> tensor: the shapes and views one dtype is saved as."""
    big = make_tensor(dtype, (6, 8), seed=3)
    return {
        "scalar": make_tensor(dtype, (), seed=1),
        "vector": make_tensor(dtype, (7,), seed=2),
        "matrix": make_tensor(dtype, (5, 6), seed=4),
        "transposed": make_tensor(dtype, (4, 3), seed=5).t(),
        "sliced": big[1:5, ::3],
        "empty": make_tensor(dtype, (0, 3), seed=6),
        "expanded": make_tensor(dtype, (3,), seed=7).expand(4, 3),
        "rank4": make_tensor(dtype, (2, 3, 1, 2), seed=8).permute(3, 1, 0, 2),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_dtype_round_trip(tmp_path, dtype):
    sd = layouts(dtype)
    assert not sd["transposed"].is_contiguous() and not sd["sliced"].is_contiguous()
    path = str(tmp_path / "d.tsar")
    tsar.save(sd, path)
    with tsar.open(path) as a:
        assert a.entries == ["model"]
        assert a.keys() == list(sd)
        for name, want in sd.items():
            got = a.tensor(name)
            assert same_tensor(got, want) == "", name
            assert same_tensor(a[name], want) == "", name
            info = a.info(name)
            assert info.name == name and info.entry == "model"
            assert info.dtype == dtype
            assert info.shape == tuple(want.shape)
            assert info.strides == tuple(want.stride())
            assert info.storage_offset == got.storage_offset()
            assert info.role == "tensor"
            assert info.requires_grad is False
            assert got.requires_grad is False
        # state_dict gives the same tensors, in the saved order.
        sdl = a.state_dict()
        assert list(sdl) == list(sd)
        for name, want in sd.items():
            assert same_tensor(sdl[name], want) == "", name
        # The views of `big` ("sliced") store only the bytes they reach (spec §4.9 rule 11),
        # and the 0-d, empty, expanded ones have what they need.
        assert a.info("empty").shape == (0, 3)
        assert a.info("scalar").shape == () and a.info("scalar").strides == ()
        assert a.info("expanded").strides == (0, 1)


def test_file_is_valid_for_the_reference_decoder(tmp_path):
    """What tsar.save writes passes the spec's independent decoder, every dtype at once."""
    sd = {}
    for dtype in DTYPES:
        for name, t in layouts(dtype).items():
            sd[f"{str(dtype)[6:]}.{name}"] = t
    path = str(tmp_path / "all.tsar")
    tsar.save(sd, path)
    ref = reference_decoder()
    data = open(path, "rb").read()
    r = ref.decode(data, path)
    assert r["header"]["file_size"] == len(data) == os.path.getsize(path)
    assert [t["name"].decode() for t in r["tensors"]] == list(sd)
    with tsar.open(path) as a:
        assert a.file_size == len(data)
        for name, want in sd.items():
            assert same_tensor(a[name], want) == "", name


def test_contiguous_values_are_the_file_bytes(tmp_path):
    """The tensor's bytes are at its storage's place in the file, little-endian."""
    t = torch.arange(1000, dtype=torch.int32) * 7919
    path = str(tmp_path / "v.tsar")
    tsar.save({"t": t}, path)
    data = open(path, "rb").read()
    raw = t.numpy().astype("<i4").tobytes()
    assert data.count(raw) == 1
    with tsar.open(path) as a:
        assert torch.equal(a["t"], t)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.frozen = torch.nn.Linear(3, 2)
        self.frozen.weight.requires_grad_(False)
        self.bn = torch.nn.BatchNorm1d(3)
        self.register_buffer("table", torch.arange(6.0).reshape(2, 3))


def test_module_roles_and_requires_grad(tmp_path):
    torch.manual_seed(0)
    m = Net().eval()
    path = str(tmp_path / "m.tsar")
    tsar.save(m, path)
    sd = m.state_dict(keep_vars=True)
    params = dict(m.named_parameters())
    with tsar.open(path) as a:
        assert a.keys() == list(sd)
        for name, want in sd.items():
            info = a.info(name)
            got = a[name]
            if name in params:
                assert info.role == "parameter", name
                assert info.requires_grad == want.requires_grad, name
                assert got.requires_grad == want.requires_grad, name
            else:
                assert info.role == "buffer", name
                assert info.requires_grad is False and got.requires_grad is False, name
            assert same_tensor(got.detach(), want.detach()) == "", name
        assert a.info("frozen.weight").requires_grad is False
        assert a.info("fc.weight").requires_grad is True
        assert a.info("bn.num_batches_tracked").dtype == torch.int64


def test_state_dict_has_role_tensor_and_keeps_parameters(tmp_path):
    """A Mapping (not a Module): Parameters in it are role parameter, plain tensors role tensor."""
    p = torch.nn.Parameter(torch.ones(3))
    sd = {"p": p, "plain": torch.zeros(2)}
    path = str(tmp_path / "r.tsar")
    tsar.save(sd, path)
    with tsar.open(path) as a:
        assert a.info("p").role == "parameter" and a.info("p").requires_grad is True
        assert a.info("plain").role == "tensor" and a.info("plain").requires_grad is False


def test_sparse_round_trip(tmp_path):
    coo = torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 4.0]]).to_sparse()
    csr = torch.tensor([[1.0, 0.0], [0.0, 5.0], [6.0, 0.0]]).to_sparse_csr()
    path = str(tmp_path / "s.tsar")
    tsar.save({"dense": torch.ones(2), "coo": coo, "csr": csr}, path)
    with tsar.open(path) as a:
        assert a.keys() == ["dense", "coo", "csr"]
        assert a["coo"].layout == torch.sparse_coo and a["csr"].layout == torch.sparse_csr
        assert torch.equal(a["coo"].to_dense(), coo.to_dense())
        assert torch.equal(a["csr"].to_dense(), csr.to_dense())
        assert a.info("coo.indices").role == "sparse_component"
