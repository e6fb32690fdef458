"""The smaller rough edges of a new user's first try (issue 42, item 5): a pack
input opened as an archive says what it is and what to do; a one-entry archive
exports to the state_dict torch.save wrote; the ImportError beside another torch
names a version pip can install; ErrorCode prints its name; a missing base names
Python's base_dirs=."""
import collections
import os
import struct

import pytest
import torch

import tsar
from tsar import _build_info
from tsar_testutil import run_cli, run_python

MAGIC = "magic: expected 89 54 53 41 52 0d 0a 1a, found "


def open_error(path):
    with pytest.raises(tsar.Error) as e:
        tsar.open(str(path))
    assert e.value.code == tsar.ErrorCode.BAD_MAGIC and e.value.offset == 0
    return str(e.value)


def pack_inputs(tmp_path):
    """One file of each kind tsar pack reads, made here: {path: what it is}."""
    import h5py
    import safetensors.torch

    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    out = {}
    safetensors.torch.save_file(sd, str(tmp_path / "m.safetensors"))
    out[tmp_path / "m.safetensors"] = "a safetensors file"
    torch.save(sd, tmp_path / "m.pt")
    out[tmp_path / "m.pt"] = "a torch.save file"
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(tmp_path / "m_ts.pt"))
    out[tmp_path / "m_ts.pt"] = "a TorchScript file"
    with h5py.File(tmp_path / "m.h5", "w") as f:
        f["w"] = sd["w"].numpy()
    out[tmp_path / "m.h5"] = "an HDF5 file"
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"metadata": {}, "weight_map": {"w": "m.safetensors"}}')
    out[tmp_path / "model.safetensors.index.json"] = "a safetensors index"
    return out


def test_open_of_a_pack_input_keeps_the_magic_message_and_says_what_it_is(tmp_path):
    for path, what in pack_inputs(tmp_path).items():
        msg = open_error(path)
        first = open(path, "rb").read(8)
        found = " ".join(f"{b:02x}" for b in first)
        assert msg == (f"{path}: offset 0 (0x0): {MAGIC}{found}; not a tsar archive ({what}): "
                       f"pack it first: tsar pack {path} -o ARCHIVE.tsar (tsar.pack in Python)"), msg
        # What it says to do works (where this tsar reads HDF5: not the wheel).
        if what == "an HDF5 file" and not _build_info.hdf5:
            continue
        if what != "a TorchScript file":  # needs tsar-torch; packed in other tests
            tsar.pack(str(path), str(tmp_path / "packed.tsar"))
            with tsar.open(str(tmp_path / "packed.tsar")) as a:
                assert len(a.infos()) >= 1


def test_a_legacy_pickled_torch_save_is_named_with_how_to_resave_it(tmp_path, cli):
    path = tmp_path / "old.pt"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    msg = open_error(path)
    assert msg.startswith(f"{path}: offset 0 (0x0): {MAGIC}80 02 ")
    assert msg.endswith(f"; not a tsar archive (a legacy torch.save file, a pickle from before "
                        f"PyTorch 1.6): tsar pack reads torch.save's zip format: re-save it with "
                        f"torch.save(torch.load({path}), NEW.pt) and pack that: "
                        f"tsar pack NEW.pt -o ARCHIVE.tsar"), msg
    # The command line says the same (tsar inspect opens the same way).
    assert run_cli(cli, "inspect", path, code=3).stderr == f"tsar: {msg}\n"


def test_a_file_that_says_nothing_keeps_the_bare_magic_message(tmp_path):
    for name, data in (("noise.bin", bytes(range(7, 71))), ("config.json", b'{"a": 1}'),
                       ("empty.tsar", b"")):
        (tmp_path / name).write_bytes(data)
        msg = open_error(tmp_path / name)
        found = " ".join(f"{b:02x}" for b in data[:8]) or "an empty file"
        # A JSON file that is not named *.index.json is not called an index.
        assert msg == f"{tmp_path / name}: offset 0 (0x0): {MAGIC}{found}", msg


def test_cpp_open_names_a_safetensors_file_too(tmp_path):
    """The hint is made in the library's open (loader/), not in Python: the
    lean tsar command, built without the Python extension, says it as well."""
    import safetensors.torch

    path = tmp_path / "x.safetensors"
    safetensors.torch.save_file({"w": torch.ones(3)}, str(path))
    with open(path, "rb") as f:
        header = struct.unpack("<Q", f.read(8))[0]
    assert header > 0
    assert "; not a tsar archive (a safetensors file): pack it first" in open_error(path)


def export_pt(cli, archive, out):
    r = run_cli(cli, "export", archive, "-o", out)
    return torch.load(out, weights_only=True), r.stderr


@pytest.mark.tsar_torch
def test_a_one_entry_archive_exports_to_the_bare_state_dict(cli, tmp_path):
    import safetensors.torch

    model = torch.nn.Linear(3, 2)
    sd = model.state_dict()
    # What save_pretrained writes: __metadata__ {"format": "pt"}, which tsar
    # keeps as archive-level metadata.
    safetensors.torch.save_file(dict(sd), str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    run_cli(cli, "pack", "-q", tmp_path / "m.safetensors", "-o", tmp_path / "st.tsar")
    tsar.save(sd, str(tmp_path / "py.tsar"), metadata={"format": "pt", "step": 7})
    for name in ("st.tsar", "py.tsar"):
        back, err = export_pt(cli, tmp_path / name, tmp_path / (name + ".pt"))
        assert sorted(back) == sorted(sd), (name, list(back))
        for k in sd:
            assert torch.equal(back[k], sd[k])
        fresh = torch.nn.Linear(3, 2)
        fresh.load_state_dict(torch.load(tmp_path / (name + ".pt")))  # strict: no stray keys
        assert torch.equal(fresh.weight, model.weight)
        # Left out, and said so.
        assert "metadata format: a state_dict has no place for archive metadata; left out" in err, err
        with tsar.open(str(tmp_path / name)) as a:
            assert a.metadata()["format"] == "pt"


@pytest.mark.tsar_torch
def test_checkpoints_beside_one_state_dict_still_export_whole(cli, tmp_path):
    sd = torch.nn.Linear(3, 2).state_dict()
    for i, ckpt in enumerate([{"model": sd, "epoch": 3, "lr": 0.5},  # top-level numbers only
                              {"model": sd},                          # a dict of one entry
                              {"model": sd, "optimizer": {"state": {}, "param_groups": []}}]):
        torch.save(ckpt, tmp_path / f"c{i}.pt")
        run_cli(cli, "pack", "-q", tmp_path / f"c{i}.pt", "-o", tmp_path / f"c{i}.tsar")
        back, _ = export_pt(cli, tmp_path / f"c{i}.tsar", tmp_path / f"b{i}.pt")
        assert type(back) is dict and list(back) == list(ckpt), back
        for k, v in ckpt.items():
            if k == "model":
                assert list(back[k]) == list(sd) and all(torch.equal(back[k][n], sd[n]) for n in sd)
            else:
                assert back[k] == v
    # A plain state_dict packed from torch.save is still a format 1.0 archive.
    torch.save(sd, tmp_path / "plain.pt")
    run_cli(cli, "pack", "-q", tmp_path / "plain.pt", "-o", tmp_path / "plain.tsar")
    data = (tmp_path / "plain.tsar").read_bytes()
    assert data[10:12] == b"\x00\x00" and data[52:56] == b"\x00\x00\x00\x00"
    back, _ = export_pt(cli, tmp_path / "plain.tsar", tmp_path / "plain_back.pt")
    assert isinstance(back, collections.OrderedDict) and list(back) == list(sd)


def test_import_beside_another_torch_runs_the_portable_path_and_all_of_it_works(tmp_path):
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "ts.pt")
    # The child without TSAR_PORTABLE, which would otherwise be the reason it names.
    code = ("import os\n"
            "os.environ.pop('TSAR_PORTABLE', None)\n"
            "import torch\n"
            "torch.__version__ = '1.0.0'\n"
            "import tsar\n"
            "print(tsar.backend())\n"
            f"tsar.save({{'w': torch.ones(2)}}, {str(tmp_path / 'x.tsar')!r})\n"
            f"tsar.save({{'s': torch.eye(2).to_sparse()}}, {str(tmp_path / 's.tsar')!r})\n"
            f"assert torch.equal(tsar.load({str(tmp_path / 'x.tsar')!r})['w'], torch.ones(2))\n"
            f"tsar.pack({str(tmp_path / 'x.tsar')!r}, {str(tmp_path / 'p.tsar')!r})\n"
            f"tsar.pack({str(tmp_path / 'ts.pt')!r}, {str(tmp_path / 'y.tsar')!r}, "
            f"arch={str(tmp_path / 'y.arch')!r})\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    built = _build_info.torch_version
    why = (f"its accelerator was built for torch {built}" if built else
           "this tsar was built without its accelerator")
    assert r.stdout.strip() == f"portable (torch 1.0.0: {why})"
    # tsar.save (sparse too), tsar.pack, TorchScript and arch= all work there.
    assert all((tmp_path / f).exists() for f in ("p.tsar", "y.tsar", "y.arch"))
    with tsar.open(tmp_path / "s.tsar") as a:
        assert torch.equal(a["s"].to_dense(), torch.eye(2))


def test_error_codes_print_their_names_and_stay_ints(tmp_path):
    code = tsar.ErrorCode.NOT_FOUND
    assert str(code) == "NOT_FOUND" and f"{code}" == "NOT_FOUND" and f"{code:>10}" == " NOT_FOUND"
    assert code == 2 and int(code) == 2 and f"{code:d}" == "2" and f"{code:#x}" == "0x2"
    assert repr(code) == "<ErrorCode.NOT_FOUND: 2>"
    assert {2: "x"}[code] == "x" and isinstance(code, int)
    with pytest.raises(tsar.Error) as e:
        tsar.open(str(tmp_path / "absent.tsar"))
    assert f"{e.value.code}" == "NOT_FOUND" and e.value.code == tsar.ErrorCode.NOT_FOUND == 2


def test_a_missing_base_names_pythons_base_dirs(tmp_path):
    base_sd = {"w": torch.randn(64, 64), "b": torch.randn(64)}
    base = str(tmp_path / "base.tsar")
    tsar.save(base_sd, base)
    layer = str(tmp_path / "v.tsar")
    tsar.save({"w": base_sd["w"], "b": base_sd["b"] + 1}, layer, base=base)
    os.unlink(base)
    with pytest.raises(tsar.Error) as e:
        tsar.open(layer)
    msg = str(e.value)
    assert e.value.code == tsar.ErrorCode.NOT_FOUND and "is missing" in msg
    assert "OpenOptions" not in msg, msg
    assert msg.endswith("(search other directories with tsar.open(path, base_dirs=[...]) or the "
                        "TSAR_BASE_PATH environment variable)"), msg
