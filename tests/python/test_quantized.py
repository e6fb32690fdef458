"""Quantized weights through tsar (issue 58): tsar.save stores each torchao
tensor as a tensor group (format 1.5, spec §4.13); tsar.open(p).state_dict()
gives the same class back with its inner tensors views of the mapping;
load_into binds a quantized archive into an architecture built with
tsar.empty_parameters(), quantized first or not, with outputs equal bit for
bit; processes that bind one archive share its pages; and a description that
lies (an unknown class, attribute, enum, malformed JSON) is a tsar.Error naming
the tensor, never an import. Both paths (tsar_path). torchao is pinned in
scripts/requirements.txt; beside the oldest torch, where it does not install,
these tests skip."""
import json
import os
import subprocess
import sys

import pytest
import torch

import tsar
from tsar_testutil import child_env, release_holders, run_cli, smaps_of_file

torchao = pytest.importorskip("torchao", reason="torchao is not installed beside this torch")
from torchao.quantization import (  # noqa: E402
    Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_)
from torchao_configs import CONFIGS  # noqa: E402


def _arch(dtype, device="cpu"):
    with torch.device(device):
        return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                                   torch.nn.Linear(96, 32)).to(dtype).eval()


def _quantized(config, dtype):
    torch.manual_seed(0)
    m = _arch(dtype)
    quantize_(m, CONFIGS[config][0]())
    return m


def _in_mapping(t, archive):
    start, n = archive._a().data_ptr, archive._a().mapped_size
    return start <= t.data_ptr() < start + n


def _inner(t):
    names, _ = t.__tensor_flatten__()
    return {n: getattr(t, n) for n in names}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_saved_groups_come_back_as_their_class_over_the_mapping(tmp_path, tsar_path, config,
                                                                  dtype):
    m = _quantized(config, dtype)
    path = tmp_path / "q.tsar"
    tsar.save(m, path)
    a = tsar.open(path)
    assert a.format_version == (1, 5)
    assert a.keys() == ["0.weight", "0.bias", "2.weight", "2.bias"]
    sd = a.state_dict()
    assert list(sd) == a.keys()
    for name in ("0.weight", "2.weight"):
        got, want = sd[name], m.state_dict()[name]
        assert type(got).__name__ == CONFIGS[config][1] and type(got) is type(want)
        assert got.shape == want.shape and got.dtype == want.dtype
        inner_got, inner_want = _inner(got), _inner(want)
        assert list(inner_got) == list(inner_want)
        for k in inner_want:
            assert torch.equal(inner_got[k], inner_want[k]), f"{name}.{k}"
            assert _in_mapping(inner_got[k], a), f"{name}.{k} is a view of the mapping"
        assert type(a[name]) is type(want)  # tensor() too
    x = torch.randn(3, 64, dtype=dtype)
    m2 = _arch(dtype)
    m2.load_state_dict(sd, assign=True)
    assert torch.equal(m2(x), m(x))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_load_into_binds_a_plain_architecture_bit_for_bit(tmp_path, tsar_path, config):
    m = _quantized(config, torch.bfloat16)
    path = tmp_path / "q.tsar"
    tsar.save(m, path)
    with tsar.empty_parameters():
        plain = _arch(torch.bfloat16)
    a = tsar.open(path)
    report = tsar.load_into(plain, a)
    assert sorted(report.bound) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert not report.missing and not report.unexpected and not report.mismatched
    assert type(plain[0].weight).__name__ == CONFIGS[config][1]
    assert isinstance(plain[0].weight, torch.nn.Parameter)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    assert torch.equal(plain(x), m(x))
    assert _in_mapping(plain[0].weight.qdata, a) and _in_mapping(plain[0].bias, a)


def test_load_into_binds_an_architecture_quantized_on_meta(tmp_path, tsar_path):
    m = _quantized("int8_dynamic", torch.float32)
    path = tmp_path / "q.tsar"
    tsar.save(m, path)
    meta = _arch(torch.float32, device="meta")
    quantize_(meta, Int8DynamicActivationInt8WeightConfig())
    assert meta[0].weight.is_meta and type(meta[0].weight).__name__ == "Int8Tensor"
    report = tsar.load_into(meta, path)
    assert len(report.bound) == 4
    x = torch.randn(2, 64)
    assert torch.equal(meta(x), m(x))


def test_a_quantized_archive_that_does_not_fit_changes_nothing(tmp_path, tsar_path):
    m = _quantized("int8_weight_only", torch.float32)
    path = tmp_path / "q.tsar"
    tsar.save(m, path)
    with tsar.empty_parameters():
        other = torch.nn.Sequential(torch.nn.Linear(64, 80), torch.nn.ReLU(),
                                    torch.nn.Linear(96, 32))
    before = [(n, p.is_meta, type(p)) for n, p in other.named_parameters()]
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(other.eval(), path)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "0.weight" in str(e.value) and "[80, 64]" in str(e.value)
    assert [(n, p.is_meta, type(p)) for n, p in other.named_parameters()] == before
    # On meta, strict=False cannot leave 0.weight there: refused, naming it.
    with pytest.raises(tsar.Error, match=r"0.weight would stay on the meta device"):
        tsar.load_into(other, path, strict=False)
    assert [(n, p.is_meta, type(p)) for n, p in other.named_parameters()] == before
    # A module made for real: strict=False binds what fits and reports the rest.
    real = torch.nn.Sequential(torch.nn.Linear(64, 80), torch.nn.ReLU(),
                               torch.nn.Linear(96, 32)).eval()
    report = tsar.load_into(real, path, strict=False)
    assert sorted(report.bound) == ["2.bias", "2.weight"]
    assert any(s.startswith("0.weight: shape [80, 64] vs archive [96, 64]")
               for s in report.mismatched), report.mismatched
    assert type(real[2].weight).__name__ == "Int8Tensor" and type(real[0].weight) is \
        torch.nn.Parameter


def test_a_group_the_module_lacks_is_unexpected(tmp_path, tsar_path):
    m = _quantized("int8_weight_only", torch.float32)
    path = tmp_path / "q.tsar"
    tsar.save(m, path)
    with tsar.empty_parameters():
        one = torch.nn.Sequential(torch.nn.Linear(64, 96))
    with pytest.raises(tsar.Error, match="not in module: 2.weight"):
        tsar.load_into(one.eval(), path)
    report = tsar.load_into(one, path, strict=False)
    assert "2.weight" in report.unexpected and "0.weight" in report.bound


def test_c_plus_plus_gives_a_group_s_members(tmp_path, cli):
    m = _quantized("int4_intx", torch.float32)
    path = tmp_path / "q.tsar"
    tsar.save(m, path)
    out = run_cli(cli, "inspect", str(path)).stdout
    assert "group 0.weight: torchao IntxUnpackedToInt8Tensor" in out
    assert "qdata 0.weight.qdata, scale 0.weight.scale, zero_point 0.weight.zero_point" in out
    assert "metadata group:" not in out  # shown as groups, not as metadata
    j = json.loads(run_cli(cli, "inspect", "--json", str(path)).stdout)
    g = j["groups"][0]
    assert (g["name"], g["class"], g["shape"], g["dtype"]) == (
        "0.weight", "IntxUnpackedToInt8Tensor", [96, 64], "float32")
    assert g["member_roles"] == ["qdata", "scale", "zero_point"]
    assert json.loads(g["description"])["attributes"]["target_dtype"] == ["dtype", "int4"]


def test_the_description_is_canonical_json(tmp_path):
    m = _quantized("int8_dynamic", torch.bfloat16)
    tsar.save(m, tmp_path / "a.tsar")
    tsar.save(m, tmp_path / "b.tsar")
    assert (tmp_path / "a.tsar").read_bytes() == (tmp_path / "b.tsar").read_bytes()
    a = tsar.open(tmp_path / "a.tsar")
    text = a.metadata("model")["group:0.weight"]
    d = json.loads(text)
    assert text == json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert d["library"] == "torchao" and d["version"] == torchao.__version__
    assert d["class"] == "Int8Tensor" and d["members"] == ["qdata", "scale", "zero_point"]
    assert d["attributes"]["act_quant_kwargs"][:2] == ["record", "QuantizeTensorToInt8Kwargs"]


# -- descriptions that lie -----------------------------------------------------------


def _write_group(path, description, members=None, shape=(4, 8), strides=(8, 1),
                 dtype="float32"):
    """An archive whose one group "w" has ``description``, written by the
    same writer as tsar.save, so that only the description lies."""
    from tsar import _portable_save, _tsar_portable

    if members is None:
        members = [("qdata", torch.ones(4, 8, dtype=torch.int8)), ("scale", torch.ones(4, 1))]
    ts = _portable_save.Tensors(str(path))
    comps = [(f".{m}", ts._dense(f"w.{m}", t, 1)) for m, t in members]
    item = ("w", 1, 4, False, shape, comps, dtype, strides, description)
    _tsar_portable.save(str(path), [("model", [item])], [], 4096, "", "", False, 0, [])


def _description(cls="Int8Tensor", attributes=None, members=("qdata", "scale"), **extra):
    d = {"library": "torchao", "version": "0.18.0", "class": cls, "members": list(members),
         "attributes": {"block_size": ["list", [1, 8]], "dtype": ["dtype", "float32"]}
         if attributes is None else attributes}
    d.update(extra)
    return json.dumps(d)


LIES = {
    "not_json": ("{", tsar.ErrorCode.INVALID_VALUE, "expected JSON"),
    "nan": ('{"library": NaN}', tsar.ErrorCode.INVALID_VALUE, "expected JSON"),
    "key_twice": (_description()[:-1] + ', "class": "Int8Tensor"}', tsar.ErrorCode.INVALID_VALUE,
                  "key 'class' twice"),
    "deep": ("[" * 200_000 + "]" * 200_000, tsar.ErrorCode.INVALID_VALUE, "expected"),
    "extra_key": (_description(module="os"), tsar.ErrorCode.INVALID_VALUE, "exactly"),
    "unknown_class": (_description(cls="system"), tsar.ErrorCode.UNSUPPORTED,
                      "class 'system' (written by torchao 0.18.0) is not in tsar's table"),
    "other_library": (_description().replace('"torchao"', '"os"'), tsar.ErrorCode.UNSUPPORTED,
                      "tsar rebuilds torchao's classes only"),
    "unknown_attribute": (_description(attributes={"block_size": ["list", [1, 8]],
                                                   "dtype": ["dtype", "float32"], "evil": 1}),
                          tsar.ErrorCode.INVALID_VALUE, "does not take evil"),
    "unknown_enum": (_description(attributes={"block_size": ["list", [1, 8]],
                                              "dtype": ["dtype", "float32"],
                                              "act_quant_kwargs": ["enum", "posix", "system"]}),
                     tsar.ErrorCode.INVALID_VALUE, "enum 'posix' is not one of tsar's"),
    "deep_typed": (_description(attributes={"block_size": ["list", [1, 8]],
                                            "dtype": ["dtype", "float32"],
                                            "act_quant_kwargs": json.loads(
                                                '["list", [' * 40 + "1" + "]]" * 40)}),
                   tsar.ErrorCode.INVALID_VALUE, "nested more than 32"),
    "members_miscounted": (_description(members=("qdata",)), tsar.ErrorCode.INVALID_VALUE,
                           "members: expected 2 distinct"),
    "missing_member": (_description(members=("qdata", "zero_point")),
                       tsar.ErrorCode.INVALID_VALUE, "missing scale"),
    "huge_int": (_description(attributes={"block_size": ["list", [1, 2**70]],
                                          "dtype": ["dtype", "float32"]}),
                 tsar.ErrorCode.INVALID_VALUE, "int64"),
    "bad_dtype": (_description(attributes={"block_size": ["list", [1, 8]],
                                           "dtype": ["dtype", "__class__"]}),
                  tsar.ErrorCode.INVALID_VALUE, "expected a dtype of this torch"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_description_that_lies_is_an_error_naming_the_tensor(tmp_path, tsar_path, lie, cli):
    description, code, words = LIES[lie]
    path = tmp_path / "lie.tsar"
    _write_group(path, description)
    a = tsar.open(path)
    before = set(sys.modules)
    for read in (lambda: a.state_dict(), lambda: a["w"]):
        with pytest.raises(tsar.Error) as e:
            read()
        assert e.value.code == code, str(e.value)
        assert "'w'" in str(e.value) and words in str(e.value), str(e.value)
        assert str(path) in str(e.value)
    assert not {"os.system", "posix.system", "system"} & (set(sys.modules) - before)
    with tsar.empty_parameters():
        m = torch.nn.Module()
        m.register_parameter("w", torch.nn.Parameter(torch.empty(4, 8)))
    with pytest.raises(tsar.Error):
        tsar.load_into(m, path)
    assert m.w.is_meta  # nothing changed
    assert "group w" in run_cli(cli, "inspect", str(path)).stdout  # inspect still shows it


def test_a_subclass_that_is_not_torchao_s_is_named(tmp_path, tsar_path):
    from torch.testing._internal.two_tensor import TwoTensor

    t = TwoTensor(torch.ones(2, 2), torch.zeros(2, 2))
    with pytest.raises(tsar.Error) as e:
        tsar.save({"w": t}, tmp_path / "x.tsar")
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED
    assert "'w'" in str(e.value) and "TwoTensor" in str(e.value)
    assert not (tmp_path / "x.tsar").exists()


def test_tsar_needs_torchao_only_for_an_archive_that_holds_groups(tmp_path):
    plain = tmp_path / "plain.tsar"
    tsar.save({"w": torch.ones(3)}, plain)
    code = ("import sys, tsar; a = tsar.open(sys.argv[1]); a.state_dict(); "
            "print('torchao' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, str(plain)], capture_output=True, text=True,
                       env=child_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


HOLDER = r"""
import sys, warnings, torch, tsar
warnings.filterwarnings("ignore")
with tsar.empty_parameters():
    m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).eval()
tsar.load_into(m, sys.argv[1])
print("ready", float(m(torch.ones(1, 2048)).float().sum()), flush=True)
sys.stdin.read()
"""


def test_two_processes_that_bind_one_quantized_archive_share_it(tmp_path, tsar_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).eval()
    quantize_(m, Int8WeightOnlyConfig())
    path = str(tmp_path / "q.tsar")
    tsar.save(m, path)
    size = os.path.getsize(path)
    want = float(m(torch.ones(1, 2048)).float().sum())
    env = child_env()
    if tsar_path == "portable":
        env["TSAR_PORTABLE"] = "1"
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("ready "), p.stderr.read() if p.poll() is not None else line
            assert float(line.split()[1]) == want  # the same outputs, bit for bit
        pss = [smaps_of_file(p.pid, path) for p in procs]
        for s in pss:
            assert s.get("Rss", 0) * 1024 >= 0.95 * size and s.get("Private_Dirty", 0) == 0
        total = sum(s.get("Pss", 0) for s in pss) * 1024
        assert total <= 1.1 * size, f"summed Pss {total} is more than one copy of {size}"
    finally:
        release_holders(procs)


def _int4_tensors():
    """One tensor of each Int4* class, made from plain inner tensors: their
    kernels (mslk, CUDA) are not on this machine, but their constructors are,
    and an archive written where the kernels work holds these forms."""
    from torchao.quantization import (Int4PlainInt32Tensor, Int4PreshuffledTensor, Int4Tensor,
                                      Int4TilePackedTo4dTensor)

    n, k, group = 32, 256, 128
    g = torch.Generator().manual_seed(0)

    def u8(*s):
        return torch.randint(0, 255, s, dtype=torch.uint8, generator=g)

    def i32(*s):
        return torch.randint(0, 2**30, s, dtype=torch.int32, generator=g)

    def bf(*s):
        return torch.randn(*s, generator=g).to(torch.bfloat16)

    size = torch.Size([n, k])
    return {
        "a.weight": Int4Tensor(u8(n, k // 2), bf(k // group, n), bf(k // group, n), [1, group],
                               size),
        "b.weight": Int4PlainInt32Tensor(i32(n, k // 8), bf(k // group, n), bf(k // group, n),
                                         [1, group], size),
        "c.weight": Int4PreshuffledTensor(u8(n, k // 2), bf(k // group, n), [1, group], [n, k],
                                          group_zero=bf(k // group, n)),
        "d.weight": Int4TilePackedTo4dTensor(i32(n // 8, k // 64, 32, 4), bf(k // group, n, 2),
                                             [1, group], size),
    }


def _same_torchao(got, want):
    names, context = want.__tensor_flatten__()
    assert type(got) is type(want) and got.shape == want.shape and got.dtype == want.dtype
    assert got.__tensor_flatten__() == (names, context)
    for n in names:
        assert torch.equal(getattr(got, n), getattr(want, n)), n


def test_the_int4_classes_are_stored_and_rebuilt_on_the_cpu(tmp_path, tsar_path, cli):
    made = _int4_tensors()
    tsar.save(made, tmp_path / "s.tsar")
    torch.save(made, tmp_path / "i4.pt")
    run_cli(cli, "pack", str(tmp_path / "i4.pt"), "-o", str(tmp_path / "p.tsar"), "--strict")
    for archive in ("s.tsar", "p.tsar"):
        sd = tsar.open(tmp_path / archive).state_dict()
        assert list(sd) == list(made)
        for name, want in made.items():
            _same_torchao(sd[name], want)


def test_a_tensor_parallel_plan_leaves_groups_whole_or_says_why(tmp_path, tsar_path):
    m = _quantized("int8_weight_only", torch.float32)
    # Patterns for the plain tensors only: the groups are stored whole beside them.
    tsar.save(m, tmp_path / "tp.tsar", tp=2, shard={"*.bias": 0})
    a = tsar.open(tmp_path / "tp.tsar")
    assert a.tp_world == 2 and a.info("0.bias").shard_dim == 0
    assert torch.equal(a.state_dict()["0.weight"].qdata, m[0].weight.qdata)
    with pytest.raises(tsar.Error) as e:
        tsar.save(m, tmp_path / "no.tsar", tp=2, shard={"*": 0})
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert "0.weight.qdata" in str(e.value) and "tensor group" in str(e.value)
    assert not (tmp_path / "no.tsar").exists()


def test_a_quantized_archive_repacks_and_layers(tmp_path, tsar_path, cli):
    m = _quantized("int4_intx", torch.bfloat16)
    base = tmp_path / "base.tsar"
    tsar.save(m, base)
    again = tmp_path / "again.tsar"
    run_cli(cli, "pack", str(base), "-o", str(again))
    assert again.read_bytes() == base.read_bytes()  # the same groups, the same bytes
    # A variant whose last layer differs, as a layer over the base: the
    # first group's members come from the base.
    v = _quantized("int4_intx", torch.bfloat16)
    with torch.no_grad():
        v[2].bias.add_(1)
    layer = tmp_path / "variant.tsar"
    tsar.save(v, layer, base=base)
    a = tsar.open(layer)
    assert a.layers[1].endswith("base.tsar")
    assert layer.stat().st_size < base.stat().st_size
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with tsar.empty_parameters():
        served = _arch(torch.bfloat16)
    tsar.load_into(served, a)
    assert torch.equal(served(x), v(x))
