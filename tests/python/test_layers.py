"""Layered archives (spec §4.11): a variant packed with a base stores only the
storages the base lacks, takes the rest from the base file, and loads exactly
as the variant it was packed from."""
import json
import os
import shutil

import pytest
import torch

import tsar
from tsar_testutil import all_parameters, child_env, in_mapping, mapped_ranges, run_cli, same_tensor


class Net(torch.nn.Module):
    """An embedding tied to the output head, a body of linear layers, a norm."""

    def __init__(self, layers=4, dim=64, vocab=300):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.body = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.body:
            x = torch.relu(layer(x))
        return self.head(self.norm(x))


def base_model():
    torch.manual_seed(0)
    return Net().eval()


def finetuned(sd, seed, touch=("body.3.weight", "body.3.bias")):
    """A copy of state_dict `sd` where the tensors `touch` changed."""
    g = torch.Generator().manual_seed(seed)
    out = {k: v.clone() for k, v in sd.items()}
    for k in touch:
        out[k] = out[k] + torch.randn(out[k].shape, generator=g)
    return out


def inspect_json(cli, path):
    return json.loads(run_cli(cli, "inspect", "--json", path).stdout)


def own_bytes(cli, path):
    j = inspect_json(cli, path)
    return sum(s["nbytes"] for s in j["storages"] if s.get("layer", 0) == 0)


def assert_state_dict(archive, want):
    got = archive.state_dict()
    assert list(got) == list(want)
    for k, v in want.items():
        assert same_tensor(got[k], v) == "", k


def test_a_variant_stores_only_what_changed_and_loads_exactly(tmp_path, cli):
    base_sd = base_model().state_dict()
    base = str(tmp_path / "base.tsar")
    tsar.save(base_sd, base)
    # Changed: body.3; added: adapter.*; removed: norm.bias.
    var = finetuned(base_sd, 1)
    var["adapter.weight"] = torch.randn(8, 64)
    del var["norm.bias"]
    torch.save(var, str(tmp_path / "var.pt"))
    os.mkdir(tmp_path / "variants")
    layer = str(tmp_path / "variants" / "var.tsar")
    out = run_cli(cli, "pack", str(tmp_path / "var.pt"), "--base", base, "-o", layer)
    assert 'layer over "../base.tsar"' in out.stderr

    with tsar.open(layer) as a:
        assert a.format_version == (1, 2)
        assert a.layers == [layer, str(tmp_path / "variants" / "../base.tsar")]
        assert_state_dict(a, var)
    j = inspect_json(cli, layer)
    layer_of = {t["name"]: j["storages"][t["storage"]]["layer"] for t in j["tensors"]}
    # Exactly the changed and added tensors are the layer's own.
    assert {k for k, v in layer_of.items() if v == 0} == {"body.3.weight", "body.3.bias", "adapter.weight"}
    changed_bytes = sum(var[k].numel() * 4 for k in ("body.3.weight", "body.3.bias", "adapter.weight"))
    assert own_bytes(cli, layer) == changed_bytes
    assert [(x["storages"], x["bytes"]) for x in j["layers"]][0] == (3, changed_bytes)
    # The file holds its own bytes and a small head, not the base's.
    assert os.path.getsize(layer) < changed_bytes + 16384

    # diff against the base: exactly what changed, was added and removed.
    d = run_cli(cli, "diff", base, layer, code=1).stdout
    assert "changed model/body.3.weight" in d and "changed model/body.3.bias" in d
    assert "added model/adapter.weight" in d and "removed model/norm.bias" in d
    assert d.count("changed model/") == 2
    run_cli(cli, "verify", layer)

    # Flattened, it is byte for byte the archive packed without a base.
    run_cli(cli, "pack", "--flatten", layer, "-o", str(tmp_path / "flat.tsar"))
    run_cli(cli, "pack", str(tmp_path / "var.pt"), "-o", str(tmp_path / "direct.tsar"))
    with open(tmp_path / "flat.tsar", "rb") as f, open(tmp_path / "direct.tsar", "rb") as g:
        assert f.read() == g.read()
    # Exports read the base's storages: the same file as from the direct archive.
    run_cli(cli, "export", layer, "-o", str(tmp_path / "l.safetensors"))
    run_cli(cli, "export", str(tmp_path / "direct.tsar"), "-o", str(tmp_path / "d.safetensors"))
    with open(tmp_path / "l.safetensors", "rb") as f, open(tmp_path / "d.safetensors", "rb") as g:
        assert f.read() == g.read()


def test_save_and_pack_with_a_base_are_deterministic(tmp_path, cli):
    m = base_model()
    base = str(tmp_path / "base.tsar")
    tsar.save(m, base)
    var = finetuned(m.state_dict(), 2)
    torch.save(var, str(tmp_path / "var.pt"))
    tsar.save(var, str(tmp_path / "py.tsar"), base=base)
    tsar.save(var, str(tmp_path / "py2.tsar"), base=base)
    run_cli(cli, "pack", str(tmp_path / "var.pt"), "--base", base, "-o", str(tmp_path / "cli.tsar"))
    summary = tsar.pack(str(tmp_path / "var.pt"), str(tmp_path / "pack.tsar"), base=base)
    assert summary.nbytes == (64 * 64 + 64) * 4
    files = {n: open(tmp_path / f"{n}.tsar", "rb").read() for n in ("py", "py2", "cli", "pack")}
    assert files["py"] == files["py2"]  # the same tensors and base, the same bytes
    assert files["cli"] == files["pack"]  # the CLI and tsar.pack are one code path
    # (tsar.save of a dict and tsar pack of its torch.save differ only in
    # that the .pt records a plain dict, which pack keeps as a value tree.)


def test_tied_weights_across_the_boundary_stay_tied_and_map_the_base(tmp_path):
    m = base_model()
    base = str(tmp_path / "base.tsar")
    tsar.save(m, base)
    v = base_model()
    with torch.no_grad():
        v.body[0].weight.add_(1.0)  # emb/head (tied) unchanged: they come from the base
    layer = str(tmp_path / "v.tsar")
    tsar.save(v, layer, base=base)

    fresh = Net().eval()
    with tsar.open(layer) as a:
        report = tsar.load_into(fresh, a)
        assert not report.missing and not report.unexpected
        params = all_parameters(fresh)
        assert params["head.weight"] is params["emb.weight"]
        base_ranges, layer_ranges = mapped_ranges(base), mapped_ranges(layer)
        assert base_ranges and layer_ranges
        # The tied embedding and the unchanged layers are pages of the base file;
        # the changed layer is a page of the layer file.
        assert in_mapping(fresh.emb.weight.data_ptr(), base_ranges)
        assert in_mapping(fresh.body[1].weight.data_ptr(), base_ranges)
        assert in_mapping(fresh.body[0].weight.data_ptr(), layer_ranges)
        ids = torch.arange(10)
        assert torch.equal(fresh(ids), v(ids))


def test_a_chain_of_three(tmp_path, cli):
    base_sd = base_model().state_dict()
    paths = [str(tmp_path / f"l{i}.tsar") for i in range(3)]
    tsar.save(base_sd, paths[0])
    v1 = finetuned(base_sd, 3, touch=("body.0.weight",))
    tsar.save(v1, paths[1], base=paths[0])
    v2 = finetuned(v1, 4, touch=("body.1.weight",))
    tsar.save(v2, paths[2], base=paths[1])
    with tsar.open(paths[2], verify="full") as a:
        assert a.layers == paths[::-1]
        assert_state_dict(a, v2)
    j = inspect_json(cli, paths[2])
    layer_of = {t["name"]: j["storages"][t["storage"]]["layer"] for t in j["tensors"]}
    assert layer_of["body.1.weight"] == 0  # its own
    assert layer_of["body.0.weight"] == 1  # from v1
    assert layer_of["body.2.weight"] == 2  # from the base, through v1
    assert [x["path"] for x in j["layers"]] == paths[::-1]
    out = run_cli(cli, "inspect", paths[2]).stdout
    assert "base of base" in out and "#" in out


def test_a_replaced_base_is_refused_never_served(tmp_path, cli):
    base_sd = base_model().state_dict()
    base = str(tmp_path / "base.tsar")
    tsar.save(base_sd, base)
    layer = str(tmp_path / "v.tsar")
    tsar.save(finetuned(base_sd, 5), layer, base=base)
    # Another model published over the base's name: same names, shapes and
    # file size, other values.
    other = base_model()
    with torch.no_grad():
        other.norm.weight.add_(1.0)
    tsar.save(other.state_dict(), base)
    with pytest.raises(tsar.Error) as e:
        tsar.open(layer)
    assert e.value.code == tsar.ErrorCode.BASE_MISMATCH
    assert layer in str(e.value) and "base.tsar" in str(e.value)
    assert "not the base this layer was packed against" in str(e.value)
    err = run_cli(cli, "verify", layer, code=3).stderr
    assert "base_id" in err
    # Removed: named, with where it was looked for.
    os.unlink(base)
    with pytest.raises(tsar.Error) as e:
        tsar.open(layer)
    assert e.value.code == tsar.ErrorCode.NOT_FOUND and "is missing" in str(e.value)


def test_a_base_elsewhere_is_found_through_the_search_list(tmp_path, cli):
    base_sd = base_model().state_dict()
    os.mkdir(tmp_path / "build")
    base = str(tmp_path / "build" / "base.tsar")
    tsar.save(base_sd, base)
    var = finetuned(base_sd, 6)
    layer = str(tmp_path / "build" / "v.tsar")
    tsar.save(var, layer, base=base)
    # Deployed: the layer in one directory, the base mounted in another.
    for d in ("serve", "mnt"):
        os.mkdir(tmp_path / d)
    shutil.move(layer, tmp_path / "serve" / "v.tsar")
    shutil.move(base, tmp_path / "mnt" / "base.tsar")
    layer = str(tmp_path / "serve" / "v.tsar")
    with pytest.raises(tsar.Error) as e:
        tsar.open(layer)
    assert e.value.code == tsar.ErrorCode.NOT_FOUND
    with tsar.open(layer, base_dirs=[str(tmp_path / "nothing"), str(tmp_path / "mnt")]) as a:
        assert a.layers[1] == str(tmp_path / "mnt" / "base.tsar")
        assert_state_dict(a, var)
    env = child_env()
    env["TSAR_BASE_PATH"] = str(tmp_path / "nothing") + ":" + str(tmp_path / "mnt")
    out = run_cli(cli, "verify", layer, env=env).stdout
    assert "through " + str(tmp_path / "mnt" / "base.tsar") in out


def test_pack_refuses_to_write_a_layer_over_its_own_base(tmp_path, cli):
    base = str(tmp_path / "base.tsar")
    tsar.save(base_model().state_dict(), base)
    torch.save(finetuned(base_model().state_dict(), 7), str(tmp_path / "v.pt"))
    err = run_cli(cli, "pack", str(tmp_path / "v.pt"), "--base", base, "-o", base, code=2).stderr
    assert "a layer is written beside its base, never over it" in err
    with tsar.open(base) as a:
        assert a.layers == [base]  # untouched
    err = run_cli(cli, "pack", "--flatten", str(tmp_path / "v.pt"), "-o", str(tmp_path / "x.tsar"),
                  code=2).stderr
    assert "--flatten: expected a tsar archive" in err


@pytest.mark.parametrize("links", [1, 2])
def test_a_checkpoint_with_a_value_tree_packs_as_a_layer(tmp_path, cli, links):
    """A value tree and a layer in one index: the layer record follows the link
    table at a multiple of 8 whatever the number of links."""
    base_sd = base_model().state_dict()
    base = str(tmp_path / "base.tsar")
    tsar.save(base_sd, base)
    ckpt = {"model": finetuned(base_sd, 8), "tags": ["x"] * links, "step": None}
    torch.save(ckpt, str(tmp_path / "ckpt.pt"))
    layer = str(tmp_path / "ckpt.tsar")
    run_cli(cli, "pack", str(tmp_path / "ckpt.pt"), "--base", base, "-o", layer)
    j = inspect_json(cli, layer)
    assert j["value_stored"] and j["format_version"] == "1.2"
    with tsar.open(layer) as a:
        assert_state_dict(a, ckpt["model"])
    run_cli(cli, "verify", layer)


def test_a_layer_opened_through_a_symlink_finds_its_base(tmp_path):
    base_sd = base_model().state_dict()
    os.mkdir(tmp_path / "v3")
    base = str(tmp_path / "v3" / "base.tsar")
    tsar.save(base_sd, base)
    var = finetuned(base_sd, 9)
    tsar.save(var, str(tmp_path / "v3" / "model.tsar"), base=base)
    os.symlink("v3/model.tsar", tmp_path / "current.tsar")  # a `current` scheme
    with tsar.open(str(tmp_path / "current.tsar")) as a:
        assert os.path.realpath(a.layers[1]) == os.path.realpath(base)
        assert_state_dict(a, var)


def test_a_ninth_layer_is_refused_and_a_base_with_nothing_in_common_gives_a_plain_archive(tmp_path, cli):
    sd = {"w": torch.arange(1024.0)}
    paths = [str(tmp_path / f"l{i}.tsar") for i in range(10)]
    tsar.save(sd, paths[0])
    for i in range(1, 9):  # depths 1..8: the most the format allows
        sd = {**sd, f"x{i}": torch.full((256,), float(i))}
        tsar.save(sd, paths[i], base=paths[i - 1])
    with tsar.open(paths[8]) as a:
        assert a.layers == paths[8::-1]
    with pytest.raises(tsar.Error) as e:
        tsar.save({**sd, "x9": torch.ones(256)}, paths[9], base=paths[8])
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert "already a layer of depth 8" in str(e.value) and "flatten it first" in str(e.value)
    assert not os.path.exists(paths[9])
    torch.save({"other": torch.zeros(7)}, str(tmp_path / "other.pt"))
    out = run_cli(cli, "pack", str(tmp_path / "other.pt"), "--base", paths[0],
                  "-o", str(tmp_path / "other.tsar"))
    assert "no storage equals one of base" in out.stderr and "wrote a standalone archive" in out.stderr
    with tsar.open(str(tmp_path / "other.tsar")) as a:
        assert a.format_version < (1, 2) and a.layers == [str(tmp_path / "other.tsar")]
