"""A model from a library nobody here wrote: transformers builds a small
LLaMA-style causal LM from a config (random weights), save_pretrained writes
sharded safetensors with an index; tsar pack of that index, the same
architecture built on the meta device and bound with load_into gives logits
bit-identical to from_pretrained of the same directory."""
import os
import subprocess

import pytest
import torch

import tsar
from tsar_testutil import in_mapping, mapped_ranges

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("tied", [False, True])
def test_llama_from_pretrained_and_tsar_on_meta_agree(tmp_path, cli, tied):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tied, torch_dtype="float32")
    model = transformers.LlamaForCausalLM(config).eval()
    hf = tmp_path / "hf"
    model.save_pretrained(hf, max_shard_size="200KB", safe_serialization=True)
    index = hf / "model.safetensors.index.json"
    assert index.exists() and len(list(hf.glob("model-*.safetensors"))) > 1

    archive = str(tmp_path / "llama.tsar")
    r = subprocess.run([cli, "pack", str(index), "-o", archive, "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    ids = torch.tensor([[1, 17, 300, 42, 7, 511]])
    reference = transformers.LlamaForCausalLM.from_pretrained(hf).eval()
    with torch.no_grad():
        want = reference(ids).logits

    with torch.device("meta"):
        fresh = transformers.LlamaForCausalLM(config)
    fresh.eval()
    # Buffers computed at construction, not saved (rotary inv_freq): the
    # archive does not have them, so they are rebuilt on the CPU first.
    saved = set(tsar.open(archive).keys())
    for name, buf in list(fresh.named_buffers()):
        if name not in saved:
            owner, _, leaf = name.rpartition(".")
            fresh.get_submodule(owner).register_buffer(
                leaf, reference.get_buffer(name).clone(), persistent=False)
    report = tsar.load_into(fresh, archive)  # strict: a tie counts as bound
    # Tied, save_pretrained stores the embedding once: lm_head.weight is that
    # same Parameter, bound through model.embed_tokens.weight.
    assert report.tied == (["lm_head.weight"] if tied else []) and report.missing == []
    assert report.mismatched == []
    if tied:
        assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    ranges = mapped_ranges(archive)
    for name, p in fresh.named_parameters():
        assert not p.is_meta and in_mapping(p.data_ptr(), ranges), name
    with torch.no_grad():
        got = fresh(ids).logits
    assert torch.equal(got, want)
