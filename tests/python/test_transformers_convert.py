"""tsar.transformers.pack (issue 56 item 8): a directory whose checkpoint
transformers 5 converts at load (Mixtral's experts, stored one by one and
fused into one tensor per layer) is converted once at pack time, so that
load_model binds it zero copy; a plain `tsar pack` of it gets a load_model
error that says so."""
import os
import subprocess
import sys

import pytest
import torch

import tsar
from tsar_testutil import child_env, in_mapping, mapped_ranges

transformers = pytest.importorskip("transformers")
tt = pytest.importorskip("tsar.transformers")


def mixtral_dir(tmp_path):
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=32)
    torch.manual_seed(0)
    d = tmp_path / "mixtral"
    transformers.MixtralForCausalLM(config).eval().save_pretrained(d)
    return d


def logits(model):
    with torch.no_grad():
        return model(torch.tensor([[1, 2, 3, 4, 5]])).logits


def test_a_checkpoint_transformers_converts_is_converted_once_and_binds_zero_copy(tmp_path):
    d = mixtral_dir(tmp_path)
    archive = tmp_path / "mixtral.tsar"
    summary = tt.pack(d, archive)
    assert "converted by transformers" in summary.notes[-1]
    with tsar.open(archive) as a:
        names = set(a.keys())
        assert a.file("config.json") == (d / "config.json").read_bytes()
    assert "model.layers.0.mlp.experts.gate_up_proj" in names  # fused, as the class has it
    assert not any(".experts.0." in n for n in names)
    model = tt.load_model(archive)
    ref = transformers.MixtralForCausalLM.from_pretrained(d).eval()
    assert torch.equal(logits(model), logits(ref))
    ranges = mapped_ranges(archive)
    assert all(in_mapping(p.data_ptr(), ranges) for p in model.parameters())
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tsar-unconverted-")]


def test_a_plain_pack_of_such_a_checkpoint_says_how_to_pack_it(tmp_path):
    d = mixtral_dir(tmp_path)
    archive = tmp_path / "plain.tsar"
    tsar.pack(d, archive)
    with pytest.raises(tsar.Error) as e:
        tt.load_model(archive)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "tsar.transformers.pack(MODEL_DIR, ARCHIVE)" in str(e.value)


def test_a_checkpoint_that_needs_no_conversion_packs_as_tsar_pack_does(tmp_path):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    d = tmp_path / "llama"
    transformers.LlamaForCausalLM(config).eval().save_pretrained(d)
    tt.pack(d, tmp_path / "a.tsar")
    tsar.pack(d, tmp_path / "b.tsar")
    assert (tmp_path / "a.tsar").read_bytes() == (tmp_path / "b.tsar").read_bytes()


def test_python_m_tsar_transformers_pack(tmp_path):
    d = mixtral_dir(tmp_path)
    r = subprocess.run([sys.executable, "-m", "tsar.transformers", "pack", str(d), "-o",
                        str(tmp_path / "m.tsar")], capture_output=True, text=True,
                       env=child_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "converted by transformers" in r.stderr
    assert torch.equal(logits(tt.load_model(tmp_path / "m.tsar")),
                       logits(transformers.MixtralForCausalLM.from_pretrained(d).eval()))
