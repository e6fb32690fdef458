"""torchao's quantized tensors taken apart into groups and rebuilt only through
tsar's closed table (tsar/_torchao.py, issue 58 items 2 and 4): for each
configuration torchao quantizes with on the CPU, every weight rebuilt from its
group (attributes through JSON, inner tensors used as given) is the same
class with the same inner tensors and attributes, and the model's outputs are
equal bit for bit. torchao is pinned in scripts/requirements.txt; beside the
oldest torch, where it does not install, these tests skip."""
import json

import pytest
import torch

import tsar
from tsar import _torchao
from tsar_testutil import bits

torchao = pytest.importorskip("torchao", reason="torchao is not installed beside this torch")
from torchao.quantization import quantize_  # noqa: E402
from torchao_configs import CONFIGS  # noqa: E402


def _model(device="cpu"):
    torch.manual_seed(0)
    with torch.device(device):
        return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                                   torch.nn.Linear(96, 32)).eval()


def _quantized(config, device="cpu"):
    make, _ = CONFIGS[config]
    m = _model(device)
    quantize_(m, make())
    return m


def test_the_table_is_what_the_pinned_torchao_constructs_with():
    for key, row in _torchao.CLASSES.items():
        cls = getattr(__import__(row.module, fromlist=[key]), key)
        assert tuple(cls.tensor_data_names) == row.tensors, key
        assert tuple(getattr(cls, "optional_tensor_data_names", None) or ()) == row.optional_tensors
        assert tuple(cls.tensor_attribute_names) == row.attributes, key
        assert tuple(getattr(cls, "optional_tensor_attribute_names", None) or ()) \
            == row.optional_attributes, key
    for table in (_torchao.ENUMS, _torchao.RECORDS):
        for key, (module, name) in table.items():
            assert getattr(__import__(module, fromlist=[name]), name).__name__ == key


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_weight_rebuilds_from_its_group_and_the_outputs_are_bit_exact(config):
    m = _quantized(config)
    x = torch.randn(5, 64)
    want = m(x)
    rebuilt = _model()
    for i in (0, 2):
        w = m[i].weight
        g = _torchao.flatten(f"{i}.weight", w)
        assert g.cls == CONFIGS[config][1] and g.cls == type(w).__name__
        assert g.torchao == torchao.__version__ and g.shape == tuple(w.shape)
        assert g.dtype == w.dtype and g.stride == tuple(w.stride())
        # What an archive would hold: the attributes as JSON, copies of the inner tensors.
        attributes = json.loads(json.dumps(g.attributes))
        inner = {n: t.clone() for n, t in g.tensors.items()}
        r = _torchao.rebuild(f"{i}.weight", g._replace(attributes=attributes, tensors=inner))
        assert type(r) is type(w)
        names, context = r.__tensor_flatten__()
        want_names, want_context = w.__tensor_flatten__()
        assert names == want_names and context == want_context
        for n in names:  # the given inner tensors, not copies of them
            assert getattr(r, n).data_ptr() == inner[n].data_ptr()
            assert torch.equal(bits(getattr(r, n)), bits(getattr(w, n)))
        rebuilt[i].weight = torch.nn.Parameter(r, requires_grad=False)
        rebuilt[i].bias = m[i].bias
    got = rebuilt(x)
    assert torch.equal(bits(got), bits(want))


def test_the_typed_tree_of_a_dataclass_attribute():
    g = _torchao.flatten("w", _quantized("int8_dynamic")[0].weight)
    assert g.attributes["dtype"] == ["dtype", "float32"]
    assert g.attributes["block_size"] == ["list", [1, 64]]
    assert g.attributes["act_quant_kwargs"] == [
        "record", "QuantizeTensorToInt8Kwargs",
        {"granularity": ["record", "PerRow", {"dim": -1}],
         "mapping_type": ["enum", "MappingType", "SYMMETRIC"], "reduce_range": False}]
    assert _torchao.encode(0.1) == ["float", (0.1).hex()]
    for v in (float("nan"), float("-inf"), -0.0, 1e-300):
        back = _torchao._Decoder("v")(json.loads(json.dumps(_torchao.encode(v))))
        assert back.hex() == v.hex()


def test_quantize_on_meta_takes_apart_into_meta_inner_tensors():
    g = _torchao.flatten("0.weight", _quantized("int8_weight_only", "meta")[0].weight)
    assert g.tensors and all(t.is_meta for t in g.tensors.values())


def test_an_int4_class_without_cpu_kernels_is_still_rebuilt_on_the_cpu():
    # Int4Tensor's kernels need CUDA (mslk): an archive written where they
    # run is still read here. Its inner tensors as torchao lays them out.
    n, k, group = 32, 64, 32
    g = _torchao.Group("Int4Tensor", {
        "qdata": torch.randint(0, 255, (n, k // 2), dtype=torch.uint8),
        "scale": torch.randn(k // group, n, dtype=torch.bfloat16),
        "zero_point": torch.randn(k // group, n, dtype=torch.bfloat16)},
        {"block_size": ["list", [1, group]], "shape": ["size", [n, k]]},
        (n, k), (k, 1), torch.bfloat16, "0.18.0")
    r = _torchao.rebuild("w", g)
    assert type(r).__name__ == "Int4Tensor" and r.shape == (n, k)
    assert r.activation_dtype == torch.bfloat16  # absent from the group: the constructor's default
    assert r.qdata.data_ptr() == g.tensors["qdata"].data_ptr()


def _nested(depth):
    v = ["list", []]
    for _ in range(depth):
        v = ["list", [v]]
    return v


def _group(config="int8_weight_only"):
    return _torchao.flatten("0.weight", _quantized(config)[0].weight)


@pytest.mark.parametrize("change, code, words", [
    (dict(cls="Int9Tensor"), tsar.ErrorCode.UNSUPPORTED,
     "class 'Int9Tensor' (written by torchao 0.17.0) is not in tsar's table"),
    (dict(attributes={"block_size": ["list", [1, 64]], "dtype": ["dtype", "float32"],
                      "granularity": None}), tsar.ErrorCode.INVALID_VALUE,
     "this torchao's class does not take granularity"),
    (dict(attributes={"dtype": ["dtype", "float32"]}), tsar.ErrorCode.INVALID_VALUE,
     "missing block_size"),
    (dict(attributes={"block_size": ["list", [1, 64]], "dtype": ["dtype", "float99"]}),
     tsar.ErrorCode.INVALID_VALUE, "dtype: expected a dtype of this torch"),
    (dict(attributes={"block_size": ["list", [1, 64]], "dtype": ["dtype", "float32"],
                      "act_quant_kwargs": ["record", "Popen", {"args": "sh"}]}),
     tsar.ErrorCode.INVALID_VALUE, "record 'Popen' is not one of tsar's torchao table"),
    (dict(attributes={"block_size": ["list", [1, 64]], "dtype": ["dtype", "float32"],
                      "reduce_range": ["enum", "os.system", "x"]}),
     tsar.ErrorCode.INVALID_VALUE, "enum 'os.system' is not one of tsar's torchao table"),
    (dict(attributes={"block_size": ["list", [1, 64]], "dtype": ["dtype", "float32"],
                      "reduce_range": ["eval", "1"]}),
     tsar.ErrorCode.INVALID_VALUE, "expected a typed value, found tag 'eval'"),
    (dict(tensors={}), tsar.ErrorCode.INVALID_VALUE, "missing qdata, scale"),
    (dict(attributes={"block_size": ["list", [1, 64]], "dtype": ["dtype", "float32"],
                      "reduce_range": _nested(100000)}),
     tsar.ErrorCode.INVALID_VALUE, "nested more than 32 deep"),
])
def test_what_the_table_does_not_take_is_refused_naming_tensor_class_and_version(change, code,
                                                                                 words):
    g = _group()._replace(torchao="0.17.0", **change)
    with pytest.raises(tsar.Error) as e:
        _torchao.rebuild("layers.3.weight", g)
    assert e.value.code == code and words in str(e.value), str(e.value)
    assert "'layers.3.weight'" in str(e.value) and "0.17.0" in str(e.value)


def test_a_subclass_that_is_not_torchao_s_is_named():
    class Mine(torch.Tensor):
        pass

    with pytest.raises(tsar.Error) as e:
        _torchao.flatten("w", torch.zeros(2).as_subclass(Mine))
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED and "Mine" in str(e.value)
    assert "a tensor subclass tsar does not know" in str(e.value)
    with pytest.raises(tsar.Error, match="which tsar cannot store"):
        _torchao.encode(object(), "w attribute 'x'")
