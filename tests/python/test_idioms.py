"""load_into in the idioms PyTorch and transformers users write (issue 42):
a module built under `with torch.device("meta")` is never left with a tensor
on meta silently (its non-persistent buffers are in no archive), the
`tsar.empty_parameters()` idiom binds bit-exact with from_pretrained, tied
weights stored once bind in strict mode through the tie, and load_into's
arguments are checked (tsar.Error naming the argument, module unchanged)."""
import subprocess

import pytest
import torch

import tsar
from tsar_testutil import in_mapping, mapped_ranges

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[1, 17, 30, 42, 7, 99, 5]])


def _llama_config(tied):
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=tied)


def _bert_config():
    return transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64)


def _gpt2_config():
    return transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4)


MODELS = {
    # name: (class, config maker, whether the archive lacks a tied name)
    "llama": (transformers.LlamaForCausalLM, lambda: _llama_config(False), False),
    "llama-tied": (transformers.LlamaForCausalLM, lambda: _llama_config(True), True),
    "gpt2": (transformers.GPT2LMHeadModel, _gpt2_config, True),
    "bert": (transformers.BertModel, _bert_config, False),
    "bert-mlm": (transformers.BertForMaskedLM, _bert_config, True),
}


@pytest.fixture(scope="module")
def packed(tmp_path_factory, cli):
    """name -> (save_pretrained directory, archive path), made once."""
    out = {}
    root = tmp_path_factory.mktemp("idioms")
    for name, (cls, config, _) in MODELS.items():
        torch.manual_seed(0)
        model = cls(config()).eval()
        hf = root / name
        model.save_pretrained(hf, safe_serialization=True)
        archive = str(root / f"{name}.tsar")
        r = subprocess.run([cli, "pack", str(hf / "model.safetensors"), "-o", archive, "-q"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out[name] = (hf, archive)
    return out


def _logits(model):
    with torch.no_grad():
        out = model(IDS)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _state(model):
    """Every tensor of the module, non-persistent buffers included."""
    return dict(model.named_parameters(remove_duplicate=False)) | dict(
        model.named_buffers(remove_duplicate=False))


@pytest.mark.parametrize("name,buffers", [
    ("bert", {"embeddings.position_ids", "embeddings.token_type_ids"}),
    ("llama", {"model.rotary_emb.inv_freq"}),
])
@pytest.mark.parametrize("strict", [True, False])
def test_a_module_built_under_torch_device_meta_is_refused_naming_its_buffers(
        packed, name, buffers, strict):
    cls, config, _ = MODELS[name]
    with torch.device("meta"):
        model = cls(config())
    model.eval()
    meta_buffers = {n for n, b in model.named_buffers() if b.is_meta}
    assert buffers <= meta_buffers  # what makes the plain idiom wrong
    before = {n: (t, t.device.type) for n, t in _state(model).items()}
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(model, packed[name][1], strict=strict)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    message = str(e.value)
    for b in buffers:
        assert repr(b).strip("'") in message
    assert "non-persistent buffers" in message and "tsar.empty_parameters()" in message
    assert "Nothing was changed" in message
    # Unchanged: the same objects, all still on meta.
    after = _state(model)
    assert set(after) == set(before)
    for n, t in after.items():
        assert t is before[n][0] and t.device.type == before[n][1] == "meta", n


@pytest.mark.parametrize("name", list(MODELS))
def test_empty_parameters_binds_strict_bit_exact_with_from_pretrained_ties_kept(packed, name):
    cls, config, tied = MODELS[name]
    hf, archive = packed[name]
    want = _logits(cls.from_pretrained(hf).eval())
    with tsar.empty_parameters():
        model = cls(config())
    model.eval()
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())
    params = dict(model.named_parameters(remove_duplicate=False))
    report = tsar.load_into(model, archive)  # strict
    assert report.missing == [] and report.unexpected == [] and report.mismatched == []
    saved = set(tsar.open(archive).keys())
    assert set(report.bound) == set(params) & saved | {
        n for n, _ in model.named_buffers() if n in saved}
    if tied:
        assert report.tied and set(report.tied) == set(params) - saved
        emb = model.get_input_embeddings().weight
        out = model.get_output_embeddings().weight
        assert out is emb and out.data_ptr() == emb.data_ptr()
    else:
        assert report.tied == []
    ranges = mapped_ranges(archive)
    for n, p in model.named_parameters(remove_duplicate=False):
        assert p is params[n], n  # the same Parameter objects
        assert not p.is_meta and in_mapping(p.data_ptr(), ranges), n
    assert torch.equal(_logits(model), want)


def test_empty_parameters_keeps_ties_of_one_object_registered_twice():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            w = torch.nn.Parameter(torch.ones(3, 2))
            self.register_parameter("a", w)
            self.register_parameter("b", w)
            self.register_buffer("n", torch.arange(3))
            self.c = torch.nn.Linear(2, 2)
            self.c.weight = self.c.weight  # re-registering a meta Parameter keeps it

    real = torch.nn.Module.register_parameter
    with tsar.empty_parameters():
        with tsar.empty_parameters():  # nested
            m = Twice()
        assert torch.nn.Module.register_parameter is not real
    assert torch.nn.Module.register_parameter is real
    assert m.a is m.b and m.a.is_meta and m.a.shape == (3, 2) and m.a.requires_grad
    assert m.c.weight.is_meta and m.c.bias.is_meta
    assert torch.equal(m.n, torch.arange(3))


def test_empty_parameters_skips_initializers_on_meta_and_restores_them():
    init, linear_init = torch.nn.init.kaiming_uniform_, torch.nn.modules.linear.init.kaiming_uniform_
    state = torch.get_rng_state()
    with tsar.empty_parameters():
        assert torch.nn.init.kaiming_uniform_ is not init
        m = torch.nn.Linear(64, 64)
        real = torch.nn.init.normal_(torch.zeros(3))  # a real tensor is still initialized
    assert torch.equal(torch.get_rng_state(), state) is False  # normal_ on the real one drew
    assert real.abs().sum() > 0 and m.weight.is_meta and m.bias.is_meta
    assert torch.nn.init.kaiming_uniform_ is init
    assert torch.nn.modules.linear.init.kaiming_uniform_ is linear_init
    state = torch.get_rng_state()
    with tsar.empty_parameters():
        torch.nn.Linear(64, 64)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn for meta parameters


class TwoNames(torch.nn.Module):
    """One Parameter under two names."""

    def __init__(self):
        super().__init__()
        self.x = torch.nn.Linear(4, 4, bias=False)
        self.y = torch.nn.Linear(4, 4, bias=False)
        self.y.weight = self.x.weight


def test_one_tensor_under_two_names_with_different_archive_bytes_is_refused(tmp_path):
    path = str(tmp_path / "two.tsar")
    tsar.save({"x.weight": torch.ones(4, 4), "y.weight": torch.full((4, 4), 2.0)}, path)
    m = TwoNames().eval()
    before = m.x.weight.detach().clone()
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, path)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert '"y.weight"' in str(e.value) or "'y.weight'" in str(e.value) or "y.weight" in str(e.value)
    assert "x.weight" in str(e.value) and "other values" in str(e.value)
    assert torch.equal(m.x.weight, before) and m.x.weight is m.y.weight
    # Not strict: the first name binds, the second is reported.
    report = tsar.load_into(m, path, strict=False)
    assert report.bound == ["x.weight"] and len(report.mismatched) == 1
    assert report.mismatched[0].startswith("y.weight: the same tensor as")
    assert torch.equal(m.y.weight, torch.ones(4, 4))


def test_one_tensor_under_two_names_with_equal_archive_bytes_binds(tmp_path):
    path = str(tmp_path / "same.tsar")
    tsar.save({"x.weight": torch.ones(4, 4), "y.weight": torch.ones(4, 4)}, path)
    m = TwoNames().eval()
    report = tsar.load_into(m, path)
    assert sorted(report.bound) == ["x.weight", "y.weight"] and m.x.weight is m.y.weight


def test_the_state_dict_fallback_also_refuses_meta_buffers(tmp_path):
    class Hooked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)
            self.register_buffer("pos", torch.arange(2), persistent=False)

    path = str(tmp_path / "h.tsar")
    tsar.save(Hooked().state_dict(), path)
    with torch.device("meta"):
        m = Hooked()
    m.register_state_dict_post_hook(lambda *a: None)  # load_into walks state_dict() then
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m.eval(), path)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH and "pos" in str(e.value)
    assert m.fc.weight.is_meta


def test_bind_report_repr_counts_the_bound_names(packed):
    with tsar.empty_parameters():
        model = transformers.LlamaForCausalLM(_llama_config(True))
    report = tsar.load_into(model.eval(), packed["llama-tied"][1])
    text = repr(report)
    assert text.startswith(f"BindReport(bound={len(report.bound)} tensors, tied=['lm_head.weight']")
    assert "model.layers.0" not in text and len(text) < 200


@pytest.mark.parametrize("kwargs,what", [
    (dict(rank=5, world=0), "rank"),
    (dict(rank=-7, world=-3), "world"),
    (dict(rank=1, world=1), "rank"),
    (dict(world=2**64), "world"),
    (dict(rank=2**63), "rank"),
    (dict(world=1.5), "world"),
    (dict(device="cuda:-1"), "device"),
    (dict(device="cpu:-1"), "device"),
    (dict(device=""), "device"),
    (dict(device="gpu"), "device"),
])
def test_bad_arguments_are_tsar_errors_naming_them(tmp_path, kwargs, what):
    path = str(tmp_path / "a.tsar")
    tsar.save(torch.nn.Linear(3, 2).state_dict(), path)
    m = torch.nn.Linear(3, 2).eval()
    before = m.weight.detach().clone()
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, path, **kwargs)
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert f"{what}:" in str(e.value) and "Nothing was changed" in str(e.value)
    assert torch.equal(m.weight, before)


def test_a_huge_world_computes_slices_without_overflow(tmp_path):
    path = str(tmp_path / "a.tsar")
    tsar.save(torch.nn.Linear(3, 2).state_dict(), path)
    # Whole shapes bind whole (replicated), whatever the world.
    m = torch.nn.Linear(3, 2).eval()
    report = tsar.load_into(m, path, rank=2**63 - 2, world=2**63 - 1)
    assert sorted(report.bound) == ["bias", "weight"]
    # A slice shape: the last rank of 2**63 - 1 gets nothing of 2 rows.
    m = torch.nn.Linear(3, 1).eval()
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, path, rank=2**63 - 2, world=2**63 - 1)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "neither whole nor rank 9223372036854775806's slice" in str(e.value)


def test_a_sparse_parameter_is_refused_naming_it(tmp_path):
    path = str(tmp_path / "a.tsar")
    tsar.save({"w": torch.eye(3)}, path)
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(torch.eye(3).to_sparse())
    m.eval()
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, path)
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert '"w"' in str(e.value) and "sparse" in str(e.value) and "Nothing was changed" in str(e.value)
    assert m.w.layout == torch.sparse_coo


class _VllmParameter(torch.nn.Parameter):
    """The shape of vLLM's BasevLLMParameter family (vllm/model_executor/
    parameter.py): __new__ takes the data, __init__ other keywords, which it
    keeps under other names (``input_dim`` as ``_input_dim``)."""

    def __new__(cls, data, **kwargs):
        return super().__new__(cls, data=data, requires_grad=False)

    def __init__(self, data, weight_loader):
        self._weight_loader = weight_loader


class _RowParameter(_VllmParameter):
    def __init__(self, input_dim, **kwargs):
        self._input_dim = input_dim
        super().__init__(**kwargs)


def test_empty_parameters_keeps_parameter_subclasses_without_calling_their_init(tmp_path):
    def loader(param, loaded):  # what vLLM's weight_loader is: a callable it keeps
        param.data.copy_(loaded)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = _RowParameter(data=torch.empty(4, 6), input_dim=1, weight_loader=loader)
            self.bias = _VllmParameter(data=torch.empty(4), weight_loader=loader)

    with tsar.empty_parameters():
        m = Layer()
    assert type(m.weight) is _RowParameter and type(m.bias) is _VllmParameter
    assert m.weight.is_meta and m.weight.shape == (4, 6) and not m.weight.requires_grad
    assert m.weight._input_dim == 1 and m.weight._weight_loader is loader
    assert m.bias._weight_loader is loader
    torch.manual_seed(0)
    tsar.save({"weight": torch.randn(4, 6), "bias": torch.randn(4)}, tmp_path / "l.tsar")
    before = m.weight
    tsar.load_into(m.eval(), tmp_path / "l.tsar")
    assert m.weight is before and type(m.weight) is _RowParameter and not m.weight.is_meta
    assert torch.equal(m.weight, tsar.open(tmp_path / "l.tsar")["weight"])
