"""A transformers model in one call (issue 42, item 4): `tsar pack MODEL_DIR`
of a save_pretrained directory keeps the weights and, byte for byte, the
config and tokenizer files (spec §4.7.1, attached files);
tsar.transformers.load_model / load_tokenizer give back a model whose logits
are bit-exact with from_pretrained(MODEL_DIR) and a tokenizer that encodes as
AutoTokenizer.from_pretrained(MODEL_DIR). Tiny models with seeded random
weights, made at test time."""
import glob
import json
import os
import tempfile

import pytest
import torch

import tsar
from tsar_testutil import (in_mapping, load_bert_bit_exact, mapped_ranges, reference_decoder, run_cli,
                           run_python)

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
import tsar.transformers as tt  # noqa: E402

IDS = torch.tensor([[1, 17, 200, 42, 7, 250, 3]])
TEXTS = ["hello world", "the quick brown fox", "hello fox [UNK] zebra", ""]


def save_tokenizer(directory):
    """A tiny BPE tokenizer trained on a few strings, saved as transformers does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]", "[PAD]", "<s>", "</s>"])
    tok.train_from_iterator(["hello world", "the quick brown fox jumps", "hello there fox"] * 5,
                            trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>",
        eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(directory)


def llama(tied):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=tied))


def gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2))


def bert():
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32))


def save_model(directory, model, sharded=False):
    torch.manual_seed(0)
    with torch.no_grad():  # seeded values, whatever the constructor's init did
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    model.eval().save_pretrained(directory, max_shard_size="100KB" if sharded else "5GB")
    if sharded:
        assert os.path.exists(os.path.join(directory, "model.safetensors.index.json"))
        assert len(glob.glob(os.path.join(directory, "model-*.safetensors"))) > 1
    else:
        assert os.path.exists(os.path.join(directory, "model.safetensors"))
    save_tokenizer(directory)
    return directory


def check_files(archive_path, directory):
    """Every attached file is the directory's, byte for byte, and every file of
    the directory that the rule attaches is there."""
    files = tsar.open(archive_path).files()
    for name, data in files.items():
        with open(os.path.join(directory, name), "rb") as f:
            assert f.read() == data, name
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert name in files
    return files


@pytest.mark.parametrize("tied,sharded", [(False, False), (True, False), (False, True),
                                          (True, True)])
def test_llama_logits_bit_exact_with_from_pretrained(tmp_path, cli, tied, sharded):
    d = save_model(str(tmp_path / "llama"), llama(tied), sharded)
    archive = str(tmp_path / "llama.tsar")
    run_cli(cli, "pack", d, "-o", archive, "-q")
    files = check_files(archive, d)
    if os.path.exists(os.path.join(d, "generation_config.json")):
        assert "generation_config.json" in files
    assert not any(n.endswith(".safetensors") or n.endswith(".index.json") for n in files)

    reference = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    model = tt.load_model(archive)
    assert type(model) is transformers.LlamaForCausalLM and not model.training
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, reference(IDS).logits)
    ranges = mapped_ranges(archive)
    for name, p in model.named_parameters():
        assert not p.is_meta and in_mapping(p.data_ptr(), ranges), name
    for name, b in model.named_buffers():
        assert not b.is_meta, name
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert model.generation_config.to_dict() == reference.generation_config.to_dict()


def test_gpt2_through_tsar_pack_and_a_converted_dtype(tmp_path):
    d = save_model(str(tmp_path / "gpt2"), gpt2())
    archive = str(tmp_path / "gpt2.tsar")
    tsar.pack(d, archive)  # the Python entry point, same importer
    check_files(archive, d)
    reference = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    normal, kaiming = torch.nn.init.normal_, torch.nn.modules.linear.init.kaiming_uniform_
    rng = torch.get_rng_state()
    model = tt.load_model(archive)
    # Initializers skip meta tensors only while the model is built: restored after.
    assert torch.nn.init.normal_ is normal and torch.nn.modules.linear.init.kaiming_uniform_ is kaiming
    from transformers import initialization
    assert initialization.TORCH_INIT_FUNCTIONS["normal_"] is torch.nn.init.normal_
    assert torch.equal(torch.get_rng_state(), rng)  # nothing drawn for weights it does not make
    ids = IDS.clamp(max=255)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied by GPT-2's config
    # dtype= other than the stored one: a converted copy, outside the mapping.
    half = tt.load_model(archive, dtype=torch.bfloat16)
    ranges = mapped_ranges(archive)
    assert half.transformer.wte.weight.dtype == torch.bfloat16
    assert not in_mapping(half.transformer.wte.weight.data_ptr(), ranges)
    assert in_mapping(model.transformer.wte.weight.data_ptr(), ranges)


def test_bert_encoder_bit_exact_with_automodel(tmp_path, cli):
    d = save_model(str(tmp_path / "bert"), bert())
    archive = str(tmp_path / "bert.tsar")
    run_cli(cli, "pack", d, "-o", archive, "-q")
    model, reference = load_bert_bit_exact(archive, d, IDS.clamp(max=255))
    # Non-persistent buffers (position_ids, token_type_ids) are real and right.
    for name, b in reference.named_buffers():
        assert torch.equal(model.get_buffer(name), b), name


def test_tokenizer_from_the_archive_encodes_as_from_pretrained(tmp_path, cli):
    d = save_model(str(tmp_path / "m"), llama(True))
    archive = str(tmp_path / "m.tsar")
    run_cli(cli, "pack", d, "-o", archive, "-q")
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "tsar-tokenizer-*")))
    tok = tt.load_tokenizer(archive)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "tsar-tokenizer-*"))) == before
    want = transformers.AutoTokenizer.from_pretrained(d)
    assert type(tok) is type(want)
    for text in TEXTS:
        assert tok(text)["input_ids"] == want(text)["input_ids"], text
    assert tok.decode(want("the quick fox")["input_ids"]) == want.decode(
        want("the quick fox")["input_ids"])
    chat = [{"role": "user", "content": "hello"}]
    assert tok.apply_chat_template(chat, tokenize=False) == want.apply_chat_template(
        chat, tokenize=False)
    assert tok.all_special_tokens == want.all_special_tokens
    got = tt.load_config(archive).to_dict()
    want = transformers.AutoConfig.from_pretrained(d).to_dict()
    assert got.pop("_name_or_path") == archive and want.pop("_name_or_path") == d
    assert got == want


def test_inspect_lists_attached_files_and_notes_skipped_ones(tmp_path, cli):
    d = save_model(str(tmp_path / "m"), llama(False))
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("# a model card\n")
    with open(os.path.join(d, "training_args.bin"), "wb") as f:
        f.write(b"\x80\x04N.")
    os.makedirs(os.path.join(d, ".cache", "huggingface"))  # hidden: no note
    os.makedirs(os.path.join(d, "checkpoint-10"))
    os.makedirs(os.path.join(d, "additional_chat_templates"))
    with open(os.path.join(d, "additional_chat_templates", "tool_use.jinja"), "w") as f:
        f.write("{{ tools }}")
    os.symlink(os.path.join(d, "config.json"), os.path.join(d, "linked.json"))  # stays inside
    secret = tmp_path / "secret.txt"  # a link out of the directory: never read
    secret.write_text("the packing host's file")
    os.symlink(secret, os.path.join(d, "notes.txt"))
    archive = str(tmp_path / "m.tsar")
    r = run_cli(cli, "pack", d, "-o", archive)
    notes = r.stderr
    assert "README.md" in notes and "not a configuration or tokenizer file" in notes
    assert "training_args.bin" in notes and "a weights file" in notes
    assert "checkpoint-10/" in notes and ".cache" not in notes
    files = check_files(archive, d)
    assert files["additional_chat_templates/tool_use.jinja"] == b"{{ tools }}"
    assert files["linked.json"] == files["config.json"]
    assert "README.md" not in files and "training_args.bin" not in files
    assert "notes.txt" not in files
    assert '"notes.txt": not attached: a symbolic link that leaves the directory' in notes

    text = run_cli(cli, "inspect", archive).stdout
    section = text[text.index("\nfiles: "):]
    assert f"files: {len(files)} attached" in section
    for name, data in files.items():
        line = next(x for x in section.splitlines() if x.strip().startswith(name + " "))
        assert line.split()[-1] == "B" and int(line.split()[-2]) == len(data) or len(data) >= 1024
    assert "file:config.json" not in text  # not a wall of bytes metadata
    assert "format = " in text  # safetensors' __metadata__ stays metadata
    j = json.loads(run_cli(cli, "inspect", archive, "--json").stdout)
    assert {f["name"]: f["bytes"] for f in j["files"]} == {n: len(b) for n, b in files.items()}
    assert not any(k.startswith("file:") for k in j["metadata"])
    # The spec's reference decoder finds the same files.
    ref = reference_decoder()
    with open(archive, "rb") as f:
        decoded = ref.decode(f.read(), archive)
    assert {n.decode(): b for n, b in ref.attached_files(decoded).items()} == files


def test_config_json_path_packs_its_directory(tmp_path, cli):
    d = save_model(str(tmp_path / "m"), gpt2())
    a, b = str(tmp_path / "a.tsar"), str(tmp_path / "b.tsar")
    run_cli(cli, "pack", d, "-o", a, "-q")
    run_cli(cli, "pack", os.path.join(d, "config.json"), "-o", b, "-q")
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read()


def test_a_directory_of_neither_layout_says_what_it_found(tmp_path, cli):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("x")
    (plain / "sub").mkdir()
    err = run_cli(cli, "pack", plain, "-o", tmp_path / "x.tsar", code=3).stderr
    assert "save_pretrained" in err and "memmap()" in err and "config.json" in err
    assert "found \"notes.txt\", \"sub\"/" in err
    # config.json beside pytorch_model.bin only: say how to get safetensors.
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text("{}")
    (old / "pytorch_model.bin").write_bytes(b"PK")
    err = run_cli(cli, "pack", old, "-o", tmp_path / "y.tsar", code=3).stderr
    assert "pytorch_model.bin" in err and "without safetensors weights" in err
    # tsar inspect of a model directory says what it is.
    d = save_model(str(tmp_path / "m"), gpt2())
    err = run_cli(cli, "inspect", d, code=3).stderr
    assert "a transformers directory, not a tsar archive" in err and "tsar pack" in err


def test_malformed_file_keys_are_metadata_not_files(cli, samples):
    # Writers refuse such keys (test_pack_dir_hostile.py); an archive another
    # writer made may hold them: samples/valid/attached_files.tsar has
    # `file:../up` (bytes), `file:s.txt` (a string) and `file:e.txt` on an entry.
    archive = os.path.join(samples, "valid", "attached_files.tsar")
    a = tsar.open(archive)
    assert dict(a.files()) == {"config.json": b"{}\n", "t/v.txt": b""}
    assert a.file("../up") is None and a.file("s.txt") is None and a.file("e.txt") is None
    assert a.metadata()["file:../up"] == b"x" and a.metadata()["file:s.txt"] == "s"  # metadata
    text = run_cli(cli, "inspect", archive).stdout
    meta = text[text.index("\nmetadata\n"):text.index("\nfiles: ")]
    for key in ("file:../up", "file:s.txt"):
        assert "  " + key in meta, key
    assert "files: 2 attached" in text
    ref = reference_decoder()
    with open(archive, "rb") as f:
        assert ref.attached_files(ref.decode(f.read(), archive)) == {b"config.json": b"{}\n",
                                                                     b"t/v.txt": b""}


def test_inspect_prints_a_float_as_the_shortest_text_that_reads_back(tmp_path, cli):
    archive = str(tmp_path / "k.tsar")
    tsar.save({"w": torch.zeros(2)}, archive, metadata={"lr": 0.9})
    text = run_cli(cli, "inspect", archive).stdout
    assert "lr = 0.9 (float)" in text  # not 0.90000000000000002


def test_load_model_of_an_archive_without_config(tmp_path):
    archive = str(tmp_path / "plain.tsar")
    tsar.save({"w": torch.zeros(2)}, archive)
    with pytest.raises(tsar.Error) as e:
        tt.load_model(archive)
    assert e.value.code == tsar.ErrorCode.NOT_FOUND
    assert "config.json" in str(e.value) and "tsar pack MODEL_DIR" in str(e.value)


def test_import_tsar_never_imports_transformers():
    r = run_python("import sys, tsar, torch\n"
                   "tsar.open; tsar.load_into\n"
                   "assert 'transformers' not in sys.modules, 'imported'\n"
                   "print('ok')")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_tsar_transformers_without_transformers_says_pip_install():
    r = run_python("import sys\n"
                   "sys.modules['transformers'] = None\n"
                   "try:\n"
                   "    import tsar.transformers\n"
                   "except ImportError as e:\n"
                   "    print('ImportError:', e)\n")
    assert r.returncode == 0, r.stderr
    assert "ImportError:" in r.stdout and "pip install transformers" in r.stdout, r.stdout


def test_attach_rule_skips_what_it_must_and_says_why(tmp_path, cli):
    d = save_model(str(tmp_path / "m"), gpt2())
    big = os.path.join(d, "huge.json")
    with open(big, "wb") as f:  # sparse: 64 MiB + 1 byte, over the cap, never read
        f.truncate((64 << 20) + 1)
    os.mkfifo(os.path.join(d, "pipe.json"))  # must not block the pack
    bad = os.path.join(d.encode(), b"latin\xe9.json")
    with open(bad, "wb") as f:
        f.write(b"{}")
    empty = os.path.join(d, "empty.txt")
    open(empty, "wb").close()
    archive = str(tmp_path / "m.tsar")
    notes = run_cli(cli, "pack", d, "-o", archive).stderr
    assert "huge.json" in notes and "67108865 bytes, over the 67108864" in notes
    assert "pipe.json" in notes and "not a regular file" in notes
    assert "latin\\xe9.json" in notes and "not UTF-8" in notes
    files = check_files(archive, d)
    assert files["empty.txt"] == b""  # an empty file is a file
    assert not {"huge.json", "pipe.json"} & set(files)


def test_archive_packed_in_another_dtype_builds_the_model_in_it(tmp_path, cli):
    """config.json says float32, the archive holds bfloat16 (tsar pack --dtype):
    the model is built in the stored dtype, bit-exact with from_pretrained(dtype=bf16)."""
    d = save_model(str(tmp_path / "m"), llama(True))
    archive = str(tmp_path / "bf16.tsar")
    run_cli(cli, "pack", d, "--dtype", "bfloat16", "-o", archive, "-q")
    model = tt.load_model(archive)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert in_mapping(model.model.embed_tokens.weight.data_ptr(), mapped_ranges(archive))
    reference = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, reference(IDS).logits)
