"""torchao-quantized transformers checkpoints through the tsar command (issue
58): `tsar pack DIR` of what save_pretrained writes for a model quantized with
TorchAoConfig stores each quantized weight as a tensor group named after the
parameter, with the description Python's tsar would write for the same
weight (writer/torchao_safetensors.cc, no Python at pack time);
tsar.transformers.load_model binds it, and `tsar export -o x.safetensors`
writes torchao's layout back, which from_pretrained reads with the archive's
config.json, giving the same logits bit for bit; `-o x.pt` pickles each group
as torch.save pickles its torchao tensor. An .h5 export is refused, naming the
groups. torchao and transformers are pinned in
scripts/requirements.txt; without either these tests skip."""
import json
import os
import struct

import pytest
import torch

import tsar
import tsar.transformers
from tsar import _torchao
from tsar_testutil import run_cli

torchao = pytest.importorskip("torchao", reason="torchao is not installed beside this torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from torchao_configs import CONFIGS  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
QUANTIZED = [f"model.layers.{i}.{m}.weight" for i in range(2) for m in LINEARS]
IDS = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny bfloat16 LLaMA as save_pretrained writes it."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        tie_word_embeddings=False, dtype="bfloat16")
    d = tmp_path_factory.mktemp("base")
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(d)
    return d


def _quantized_dir(base, dst, config, **save_kwargs):
    """save_pretrained of the base quantized with TorchAoConfig (the only way
    transformers saves torchao weights); returns that model."""
    q = transformers.LlamaForCausalLM.from_pretrained(
        base, quantization_config=transformers.TorchAoConfig(CONFIGS[config][0]()),
        dtype=torch.bfloat16).eval()
    q.save_pretrained(dst, **save_kwargs)
    return q


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def _header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return h, h.pop("__metadata__", {})


def _reference(path):
    return transformers.LlamaForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_pack_stores_each_quantized_weight_as_a_group_and_export_gives_it_back(
        tmp_path, cli, base, config):
    hf = tmp_path / "hf"
    _quantized_dir(base, hf, config)
    archive = tmp_path / "m.tsar"
    run_cli(cli, "pack", hf, "-o", archive, "-q")

    reference = _reference(hf)
    want = _logits(reference)
    groups = tsar.open(str(archive))._a().groups("model")
    by_name = {g[0]: g for g in groups}
    assert sorted(by_name) == sorted(QUANTIZED)
    params = dict(reference.named_parameters())
    for name, (gname, members, sizes, strides, dtype, description) in by_name.items():
        w = params[name]
        assert type(w).__name__ == CONFIGS[config][1]
        # What Python's tsar writes for the weight from_pretrained made (the
        # version aside: the file does not say which torchao wrote it).
        g = _torchao.flatten(name, w)._replace(torchao="unknown")
        assert description == _torchao.describe(g), name
        assert members == [f"{name}.{m}" for m in g.tensors]
        assert tuple(sizes) == tuple(w.shape) and tuple(strides) == tuple(w.stride())
        assert str(dtype).replace("torch.", "") == "bfloat16"  # a str on the portable path
    a = tsar.open(str(archive))
    # torchao's metadata says what the groups say: not kept twice.
    assert "tensor_names" not in a.metadata() and QUANTIZED[0] not in a.metadata()
    assert a.file("config.json") == (hf / "config.json").read_bytes()

    # Rebuilt in Python: each group is its class again, over the archive.
    sd = a.state_dict()
    for name in QUANTIZED:
        assert type(sd[name]) is type(params[name])
        names, context = sd[name].__tensor_flatten__()
        want_names, want_context = params[name].__tensor_flatten__()
        assert names == want_names and context == want_context
        for n in names:
            assert torch.equal(getattr(sd[name], n), getattr(params[name], n))

    # load_model binds every group where from_pretrained put its weight.
    model = tsar.transformers.load_model(str(archive))
    assert torch.equal(_logits(model), want)

    # Export: torchao's layout, which from_pretrained reads.
    out = tmp_path / "out"
    out.mkdir()
    run_cli(cli, "export", archive, "-o", out / "model.safetensors", "-q")
    (out / "config.json").write_bytes(a.file("config.json"))
    h0, m0 = _header(hf / "model.safetensors")
    h1, m1 = _header(out / "model.safetensors")
    assert {k: (v["dtype"], v["shape"]) for k, v in h1.items()} == \
        {k: (v["dtype"], v["shape"]) for k, v in h0.items()}
    assert set(json.loads(m1.pop("tensor_names"))) == set(json.loads(m0.pop("tensor_names")))
    assert m1 == m0  # byte for byte, each quantized weight's JSON included
    assert torch.equal(_logits(_reference(out)), want)
    # Packed again, the same groups.
    again = tmp_path / "again.tsar"
    run_cli(cli, "pack", out / "model.safetensors", "-o", again, "-q")
    assert tsar.open(str(again))._a().groups("model") == groups


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_export_to_pt_pickles_each_group_as_torch_save_does(tmp_path, cli, base, config):
    hf = tmp_path / "hf"
    _quantized_dir(base, hf, config)
    archive = tmp_path / "m.tsar"
    run_cli(cli, "pack", hf, "-o", archive, "-q")
    run_cli(cli, "export", archive, "-o", tmp_path / "m.pt", "-q")
    reference = _reference(hf)
    want = reference.state_dict()
    # Its enums pickle through getattr, which weights_only=True refuses, as it
    # refuses torch.save's own file of the same state_dict.
    sd = torch.load(tmp_path / "m.pt", weights_only=False)
    assert set(sd) == set(want)
    for name, w in want.items():
        got = sd[name]
        assert type(got) is type(w), name
        if name not in QUANTIZED:
            assert torch.equal(got, w) and got.dtype == w.dtype, name
            continue
        assert got.shape == w.shape and got.dtype == w.dtype and got.stride() == w.stride()
        names, context = got.__tensor_flatten__()
        assert (names, context) == w.__tensor_flatten__(), name
        for n in names:
            assert torch.equal(getattr(got, n), getattr(w, n)), (name, n)
        # The instance's __dict__ is what torch.load of torch.save's file gives
        # (transformers' own markers aside).
        assert sorted(got.__dict__) == sorted(k for k in w.__dict__ if not k.startswith("_is_"))
    model = _reference(base)  # plain weights, replaced by the file's
    model.load_state_dict(sd, assign=True)
    assert type(model.model.layers[0].self_attn.q_proj.weight).__name__ == CONFIGS[config][1]
    assert torch.equal(_logits(model), _logits(reference))
    # tsar pack of that .pt (the torch.save importer) gives the same groups.
    run_cli(cli, "pack", tmp_path / "m.pt", "-o", tmp_path / "back.tsar", "--strict", "-q")
    assert tsar.open(str(tmp_path / "back.tsar"))._a().groups("model") == \
        tsar.open(str(archive))._a().groups("model")


def test_export_to_pt_of_a_description_without_optional_attributes(tmp_path, cli, samples):
    """samples/valid/groups.tsar leaves Int8Tensor's optional attributes out:
    the .pt holds what its __init__ stores without them, as tsar's rebuild."""
    src = os.path.join(samples, "valid", "groups.tsar")
    run_cli(cli, "export", src, "-o", tmp_path / "g.pt", "-q")
    got = torch.load(tmp_path / "g.pt", weights_only=True)["0.weight"]
    want = tsar.open(src).state_dict()["0.weight"]
    assert type(got) is type(want)
    assert got.__tensor_flatten__() == want.__tensor_flatten__()
    assert torch.equal(got.dequantize(), want.dequantize())


def test_export_to_h5_refuses_groups(tmp_path, cli, base):
    hf = tmp_path / "hf"
    _quantized_dir(base, hf, "int8_weight_only")
    archive = tmp_path / "m.tsar"
    run_cli(cli, "pack", hf, "-o", archive, "-q")
    r = run_cli(cli, "export", archive, "-o", tmp_path / "m.h5", code=3)
    assert "tensor groups" in r.stderr and QUANTIZED[0] in r.stderr and ".safetensors" in r.stderr
    assert not (tmp_path / "m.h5").exists()


def test_a_sharded_checkpoint_groups_members_across_shards(tmp_path, cli, base):
    hf = tmp_path / "hf"
    _quantized_dir(base, hf, "int8_dynamic", max_shard_size="40KB")
    shards = sorted(p.name for p in hf.glob("model-*.safetensors"))
    assert len(shards) > 1
    archive = tmp_path / "m.tsar"
    run_cli(cli, "pack", hf, "-o", archive, "-q")
    assert sorted(g[0] for g in tsar.open(str(archive))._a().groups("model")) == sorted(QUANTIZED)
    model = tsar.transformers.load_model(str(archive))
    assert torch.equal(_logits(model), _logits(_reference(hf)))


def _with_metadata(src, dst, edit):
    """The safetensors file `src` with its __metadata__ changed by edit(dict)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(meta)
    save_file(tensors, str(dst), metadata=meta)


@pytest.mark.parametrize("case", ["unknown class", "unknown enum", "not json", "missing inner",
                                  "unknown attribute"])
def test_what_tsar_does_not_know_is_refused_with_strict_and_kept_plain_without(
        tmp_path, cli, base, case):
    hf = tmp_path / "hf"
    _quantized_dir(base, hf, "float8_weight_only")
    name = QUANTIZED[3]

    def edit(meta):
        d = json.loads(meta[name])
        if case == "unknown class":
            d["_type"] = "MXTensor"
        elif case == "unknown enum":
            d["_data"]["kernel_preference"]["_type"] = "Preference"
        elif case == "not json":
            meta[name] = "{"
            return
        elif case == "missing inner":
            d["_tensor_data_names"] = ["qdata"]
        else:
            d["_data"]["colour"] = 1
        meta[name] = json.dumps(d)

    odd = tmp_path / "odd.safetensors"
    _with_metadata(hf / "model.safetensors", odd, edit)
    archive = tmp_path / "m.tsar"
    r = run_cli(cli, "pack", odd, "-o", archive, "--strict", code=3)
    assert str(odd) in r.stderr and name in r.stderr, r.stderr
    assert not archive.exists()
    r = run_cli(cli, "pack", odd, "-o", archive)
    assert name in r.stderr and "plain tensor" in r.stderr, r.stderr
    a = tsar.open(str(archive))
    assert a._a().groups("model") == []
    prefix = name.rsplit(".", 1)[0] + "._weight_"
    assert prefix + "qdata" in a.keys() and "tensor_names" in a.metadata()
