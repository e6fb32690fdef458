#!/usr/bin/python3
"""make_transformers_model.py OUTDIR [--layers N --hidden N --seed S]

Makes a small LLaMA-style causal LM and its tokenizer offline (random weights,
fixed seed; a BPE tokenizer trained on a few sentences) and writes:
  OUTDIR/hf/          what transformers' save_pretrained writes (model.safetensors,
                      config.json, generation_config.json, tokenizer files)
  OUTDIR/model.tsar   tsar.pack(OUTDIR/hf): the weights and those files in one archive
A real model directory packs the same way: tsar pack MODEL_DIR -o model.tsar.
"""
import argparse
import os

import torch

SENTENCES = ["the quick brown fox jumps over the lazy dog", "hello world, hello tsar",
             "one archive, many workers, one copy of the weights in memory"]


def make(outdir, layers=2, hidden=128, seed=0):
    import tokenizers
    import transformers

    import tsar

    hf = os.path.join(outdir, "hf")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES * 4, tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    archive = os.path.join(outdir, "model.tsar")
    tsar.pack(hf, archive)
    return hf, archive


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    hf, archive = make(a.outdir, a.layers, a.hidden, a.seed)
    print(f"wrote {hf}/ (save_pretrained) and {archive} (tsar.pack of it)")


if __name__ == "__main__":
    main()
