"""`tsar pack MODEL_DIR` of a directory you did not write (issue 56, items 4, 11,
13, 14 and the pack messages of 16): attached files are held once and capped
in all, config.json must be usable, links out of the directory are never
listed, "file:" keys outside the grammar of spec §4.7.1 are never written,
and the messages say what is wrong. Every input is made at test time; the
archives are read with the spec's reference decoder, so the tests that need
only the command run without the Python package."""
import json
import os
import struct
import subprocess
import sys

import pytest

from tsar_testutil import reference_decoder

MiB = 1 << 20


@pytest.fixture(scope="module")
def tsar_cli():
    path = os.environ.get("TSAR_CLI")
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"TSAR_CLI={path!r}: expected the tsar executable")
    return path


def run(cli, *args, code=0):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    return r


def metadata_keys(archive):
    """The archive-level metadata keys and the attached files, by the spec's decoder."""
    ref = reference_decoder()
    with open(archive, "rb") as f:
        decoded = ref.decode(f.read(), str(archive))
    files = {n.decode(): b for n, b in ref.attached_files(decoded).items()}
    return files, decoded


def write_safetensors(path, metadata=None):
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + struct.pack("<2f", 1.0, 2.0))


def model_dir(path, config=b'{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}'):
    os.makedirs(path, exist_ok=True)
    write_safetensors(os.path.join(path, "model.safetensors"))
    if config is not None:
        with open(os.path.join(path, "config.json"), "wb") as f:
            f.write(config)
    return path


def refused(cli, src, out, *needles, args=()):
    r = run(cli, "pack", src, "-o", out, "-q", *args, code=3)
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)
    assert not os.path.exists(out), "nothing is written for a refused input"
    return r.stderr


# --- item 4: attached files are read once, and capped in all -----------------------------------

def peak_rss_of(cmd):
    """The peak resident set of `cmd`, run by a fresh Python whose only child it is."""
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], capture_output=True)\n"
             "sys.stderr.write(r.stderr.decode(errors='replace'))\n"
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", probe, *map(str, cmd)], capture_output=True,
                       text=True, check=True)
    code, kib = r.stdout.split()
    return int(code), int(kib) * 1024, r.stderr


def test_attached_files_are_held_once(tsar_cli, tmp_path):
    """4 x 48 MiB tokenizer-like files: the pack holds each once (read into
    memory, then moved into the archive's head, which is encoded once): peak
    below 2x their total plus what the command needs anyway (it took about 4x)."""
    d = model_dir(str(tmp_path / "m"))
    for i in range(4):
        with open(os.path.join(d, f"vocab{i}.txt"), "wb") as f:
            f.write(bytes([65 + i]) * (48 * MiB))
    total = 4 * 48 * MiB
    archive = tmp_path / "m.tsar"
    code, peak, err = peak_rss_of([tsar_cli, "pack", d, "-o", archive, "-q"])
    assert code == 0, err
    print(f"peak RSS of tsar pack: {peak / MiB:.0f} MiB for {total / MiB:.0f} MiB attached")
    assert peak < 2 * total + 32 * MiB, (peak / MiB, total / MiB)
    j = json.loads(run(tsar_cli, "inspect", archive, "--json").stdout)
    sizes = {f["name"]: f["bytes"] for f in j["files"]}
    assert all(sizes[f"vocab{i}.txt"] == 48 * MiB for i in range(4)), sizes


def test_attached_files_over_the_total_are_refused_naming_the_file(tsar_cli, tmp_path):
    """Five 60 MiB files (each under the 64 MiB a file may have): the fifth
    brings the total over 256 MiB: exit 3 naming it and the limit."""
    d = model_dir(str(tmp_path / "m"))
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt"):
        with open(os.path.join(d, name), "wb") as f:
            f.truncate(60 * MiB)  # sparse: cheap to make, read as zeros
    err = refused(tsar_cli, d, tmp_path / "m.tsar", os.path.join(d, "e.txt"), "268435456",
                  "in all")
    assert "a.txt" not in err


# --- item 11 and 16: config.json must be usable ------------------------------------------------

def deep_object(levels):
    return b'{"a":' * levels + b"1" + b"}" * levels


@pytest.mark.parametrize("case, config, needle", [
    ("not UTF-8", b'{"model_type": "caf\xe9"}', "not UTF-8"),
    ("not JSON", b'{"model_type": llama}', "not JSON"),
    ("empty", b"", "not JSON"),
    ("a list", b'[{"model_type": "llama"}]', "an array, not an object"),
    ("100k deep", deep_object(100000), "nested deeper than 64"),
    ("NUL", b'{"model_type": "llama"}\0', "NUL byte"),
])
def test_an_unusable_config_json_is_refused(tsar_cli, tmp_path, case, config, needle):
    d = model_dir(str(tmp_path / "m"), config)
    refused(tsar_cli, d, tmp_path / "m.tsar", os.path.join(d, "config.json"),
            "tsar.transformers.load_model", needle)
    # Made usable, it packs and is attached byte for byte.
    usable = b'{\n  "model_type": "llama",\n  "rope_scaling": {"type": "linear", "factor": 2.0}\n}\n'
    model_dir(d, usable)
    run(tsar_cli, "pack", d, "-o", tmp_path / "m.tsar", "-q")
    files, _ = metadata_keys(tmp_path / "m.tsar")
    assert files == {"config.json": usable}


def test_a_config_json_over_64_mib_is_refused(tsar_cli, tmp_path):
    d = model_dir(str(tmp_path / "m"), None)
    with open(os.path.join(d, "config.json"), "wb") as f:
        f.truncate(64 * MiB + 1)
    refused(tsar_cli, d, tmp_path / "m.tsar", "config.json", "67108865 bytes", "67108864")


def test_a_config_json_linked_out_of_the_directory_is_refused(tsar_cli, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_bytes(b'{"model_type": "llama"}')
    d = model_dir(str(tmp_path / "m"), None)
    os.symlink(outside, os.path.join(d, "config.json"))
    refused(tsar_cli, d, tmp_path / "m.tsar", "config.json", "leaves",
            "tsar.transformers.load_model")
    # --follow-symlinks follows it (a Hugging Face cache snapshot).
    run(tsar_cli, "pack", d, "-o", tmp_path / "f.tsar", "-q", "--follow-symlinks")
    files, _ = metadata_keys(tmp_path / "f.tsar")
    assert files["config.json"] == b'{"model_type": "llama"}'


def test_a_fifo_config_json_is_refused_as_not_a_regular_file(tsar_cli, tmp_path):
    d = model_dir(str(tmp_path / "m"), None)
    os.mkfifo(os.path.join(d, "config.json"))  # must not block the pack
    refused(tsar_cli, d, tmp_path / "m.tsar", "config.json", "a FIFO")


def test_a_dangling_config_json_link_is_refused(tsar_cli, tmp_path):
    d = model_dir(str(tmp_path / "m"), None)
    os.symlink("nowhere.json", os.path.join(d, "config.json"))
    refused(tsar_cli, d, tmp_path / "m.tsar", "config.json", "which names nothing")


# --- item 13: a link out of the directory is never listed --------------------------------------

def test_chat_templates_linked_out_are_not_listed(tsar_cli, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host_secret_name.jinja").write_text("{{ secret }}")
    d = model_dir(str(tmp_path / "m"))
    os.symlink(outside, os.path.join(d, "additional_chat_templates"))
    archive = tmp_path / "m.tsar"
    err = run(tsar_cli, "pack", d, "-o", archive).stderr
    assert "host_secret_name" not in err, err
    assert '"additional_chat_templates/": not read: a symbolic link that leaves' in err, err
    files, _ = metadata_keys(archive)
    assert set(files) == {"config.json"}


def test_a_file_linked_out_is_noted_without_its_size(tsar_cli, tmp_path):
    """A link out is not stat'ed through: its target's size is not told."""
    outside = tmp_path / "big.json"
    with open(outside, "wb") as f:
        f.truncate(64 * MiB + 12345)
    d = model_dir(str(tmp_path / "m"))
    os.symlink(outside, os.path.join(d, "tokenizer.json"))
    err = run(tsar_cli, "pack", d, "-o", tmp_path / "m.tsar").stderr
    assert '"tokenizer.json": not attached: a symbolic link that leaves the directory' in err
    assert "67121209" not in err


# --- item 16: what is wrong, said as it is ----------------------------------------------------

@pytest.mark.parametrize("shard, needle", [
    ("/etc/x.safetensors", "an absolute path \"/etc/x.safetensors\""),
    ("", "an empty path \"\""),
    ("a\0b.safetensors", "a path with a NUL byte"),
    ("../x.safetensors", "a path with a \"..\" component"),
])
def test_a_bad_shard_path_is_named_for_what_it_is(tsar_cli, tmp_path, shard, needle):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"w": shard}}))
    err = refused(tsar_cli, d, tmp_path / "m.tsar", "weight_map: tensor \"w\"", needle)
    if shard != "../x.safetensors":
        assert "found a path with a \"..\"" not in err


@pytest.mark.parametrize("weights", ["model.safetensors", "model.safetensors.index.json"])
def test_a_folder_without_config_json_says_pack_the_file(tsar_cli, tmp_path, weights):
    d = tmp_path / "w"
    d.mkdir()
    if weights == "model.safetensors":
        write_safetensors(str(d / weights))
    else:
        write_safetensors(str(d / "model-00001-of-00001.safetensors"))
        (d / weights).write_text(
            json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    refused(tsar_cli, d, tmp_path / "w.tsar", f"pack the file: tsar pack {d}/{weights}")


# --- item 14: writers never write a "file:" key outside the grammar ---------------------------

BAD_FILE_KEYS = ["file:../../x.json", "file:", "file:/etc/cron.d/x", "file:a//b", "file:./x",
                 "file:dir/", "file:a/../b"]


def test_pack_meta_refuses_a_bad_file_key(tsar_cli, tmp_path):
    src = tmp_path / "w.safetensors"
    write_safetensors(str(src))
    for key in ("file:../x", "file:/etc/cron.d/x", "file:"):
        refused(tsar_cli, src, tmp_path / "w.tsar", f'metadata "{key}"', "key: expected an attached file",
                args=("--meta", f"{key}=1"))


def test_pack_leaves_out_an_inputs_bad_file_keys_with_a_note(tsar_cli, tmp_path):
    src = tmp_path / "w.safetensors"
    write_safetensors(str(src), {"file:../../x.json": "1", "file:": "2", "file:ok.txt": "3",
                                 "format": "pt"})
    archive = tmp_path / "w.tsar"
    err = run(tsar_cli, "pack", src, "-o", archive).stderr
    assert 'metadata "file:../../x.json": not written' in err, err
    assert 'metadata "file:": not written' in err, err
    assert 'metadata "file:ok.txt": not written' in err and "a str value" in err, err
    files, decoded = metadata_keys(archive)
    assert files == {}
    text = run(tsar_cli, "inspect", archive).stdout
    assert "file:" not in text and "format" in text


@pytest.mark.parametrize("key", BAD_FILE_KEYS + ["file:a\0b"])
def test_tsar_save_refuses_a_bad_file_key(tmp_path, key):
    torch = pytest.importorskip("torch")
    tsar = pytest.importorskip("tsar")
    path = str(tmp_path / "s.tsar")
    with pytest.raises(tsar.Error) as e:
        tsar.save(torch.nn.Linear(2, 2), path, metadata={key: b"1"})
    assert e.value.code == tsar.ErrorCode.INVALID_VALUE
    assert "key: expected an attached file" in str(e.value)
    assert not os.path.exists(path)
    tsar.save(torch.nn.Linear(2, 2), path, metadata={"file:ok/a.txt": b"1"})
    assert tsar.open(path).files() == {"ok/a.txt": b"1"}
