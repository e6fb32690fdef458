"""save -> open keeps every dtype, shape, stride and bit; 0-d, empty and
non-contiguous tensors; roles and requires_grad."""
import json
import os
import subprocess

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


# Format 1.3 added codes 19-22 (spec §5.1, §7.1): an archive that uses one is
# written as minor 3, any other stays what a 1.0 writer writes.
# (Those this torch has: float8_e8m0fnu came with 2.7, float4_e2m1fn_x2 with 2.8.)
FORMAT_1_3 = [getattr(torch, n) for n in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
                                          "float4_e2m1fn_x2") if hasattr(torch, n)]
_FP4 = getattr(torch, "float4_e2m1fn_x2", None)


def test_new_dtypes_make_a_minor_3_archive_and_old_ones_do_not(tmp_path):
    old = {"w": make_tensor(torch.float8_e4m3fn, (4,), seed=1), "i": torch.arange(3)}
    tsar.save(old, str(tmp_path / "old.tsar"))
    with tsar.open(str(tmp_path / "old.tsar")) as a:
        assert a.format_version == (1, 0)
    for dtype in FORMAT_1_3:
        path = str(tmp_path / f"{str(dtype)[6:]}.tsar")
        tsar.save(dict(old, new=make_tensor(dtype, (4,), seed=2)), path)
        with tsar.open(path) as a:
            assert a.format_version == (1, 3), dtype
            assert same_tensor(a["new"], make_tensor(dtype, (4,), seed=2)) == ""
        # The spec's own decoder agrees, and refuses the same file relabelled minor 0.
        ref = reference_decoder()
        data = bytearray(open(path, "rb").read())
        assert ref.decode(bytes(data), path)["header"]["minor"] == 3
        data[10:12] = (0).to_bytes(2, "little")  # and refix index_xxh3 (§4.1: bytes [0, 56) and the index)
        index_end = int.from_bytes(data[24:32], "little") + int.from_bytes(data[32:40], "little")
        data[56:64] = ref.xxh3(bytes(data[:56] + data[64:index_end])).to_bytes(8, "little")
        with pytest.raises(ref.TsarError) as e:
            ref.decode(bytes(data), path)
        assert e.value.code == "bad_dtype" and "needs minor 3" in str(e.value)
        open(path, "wb").write(data)
        with pytest.raises(tsar.Error) as e:
            tsar.open(path)
        assert e.value.code == tsar.ErrorCode.BAD_DTYPE and "needs minor 3" in str(e.value)


def _fp4(nibble):
    """FP4 E2M1 by the spec's table (§5.1), independent of cli/element_diff.cc."""
    mag = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][nibble & 7]
    return -mag if nibble & 8 else mag


def _values(dtype, raw):
    """Each byte's value(s) as float64: torch's own conversion where it has one."""
    if dtype == _FP4:
        return torch.tensor([[_fp4(b & 15), _fp4(b >> 4)] for b in raw.tolist()], dtype=torch.float64)
    return raw.view(dtype).to(torch.float64).unsqueeze(1)


@pytest.mark.parametrize("dtype", FORMAT_1_3, ids=lambda d: str(d)[6:])
def test_diff_decodes_new_dtypes_as_torch_does(tmp_path, cli, dtype):
    """tsar diff's element decoders against torch's (and the spec's FP4 table): every
    byte value against its neighbour, the largest |a - b| and how many differ."""
    a_raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    b_raw = (a_raw.to(torch.int32) + 1).remainder(256).to(torch.uint8)
    va, vb = _values(dtype, a_raw), _values(dtype, b_raw)
    finite = torch.isfinite(va).all(1) & torch.isfinite(vb).all(1)
    a_raw, b_raw, va, vb = a_raw[finite], b_raw[finite], va[finite], vb[finite]
    tsar.save({"x": a_raw.view(dtype)}, str(tmp_path / "a.tsar"))
    tsar.save({"x": b_raw.view(dtype)}, str(tmp_path / "b.tsar"))
    dist = (va - vb).pow(2).sum(1).sqrt()  # a pair (FP4 x2) is compared as a complex value is
    r = subprocess.run([cli, "diff", str(tmp_path / "a.tsar"), str(tmp_path / "b.tsar"), "--json",
                        "--atol", "1e-300"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    changed = json.loads(r.stdout)["changed"]
    assert len(changed) == 1 and changed[0]["name"].endswith("x")
    assert changed[0]["elements"] == len(a_raw)
    assert changed[0]["differing_elements"] == int((dist > 1e-300).sum())
    assert changed[0]["max_abs_diff"] == pytest.approx(dist.max().item(), rel=1e-12)


@pytest.mark.skipif(_FP4 is None, reason="torch has float4_e2m1fn_x2 from 2.8")
def test_a_0d_fp4_pair_cannot_go_to_safetensors(tmp_path, cli):
    """safetensors' F4 shape counts FP4 values, so a 0-d float4_e2m1fn_x2 (one byte, two
    values) has no shape there: export refuses it naming the tensor; with a dimension the
    last one doubles."""
    one = torch.tensor(0x21, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    tsar.save({"pair": one, "row": torch.arange(3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)},
              str(tmp_path / "a.tsar"))
    r = subprocess.run([cli, "export", str(tmp_path / "a.tsar"), "-o", str(tmp_path / "a.safetensors")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert '"model/pair"' in r.stderr or '"pair"' in r.stderr, r.stderr
    assert "0-dimensional float4_e2m1fn_x2" in r.stderr
    assert not os.path.exists(tmp_path / "a.safetensors")
    tsar.save({"row": torch.arange(3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)},
              str(tmp_path / "b.tsar"))
    subprocess.run([cli, "export", str(tmp_path / "b.tsar"), "-o", str(tmp_path / "b.safetensors")],
                   check=True, capture_output=True, timeout=60)
    data = open(tmp_path / "b.safetensors", "rb").read()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    assert header["row"]["dtype"] == "F4" and header["row"]["shape"] == [6]
