"""Tensor-parallel archives (format 1.4, spec §4.12): tsar.save/pack with tp= and
shard=, Archive.shard, load_into(rank=, world=), the CLI's --tp/--shard-plan."""
import json
import os

import pytest
import torch

import tsar
from tsar_testutil import REPO, bits, evict_from_page_cache, run_cli, smaps_of_file


def _source(dtype):
    torch.manual_seed(0)
    sd = {
        "col.weight": torch.randn(64, 48).to(dtype),  # split on dim 0
        "row.weight": torch.randn(48, 64).to(dtype),  # split on dim 1
        "conv": torch.randn(8, 12, 4, 4).to(dtype),  # split on dim 2
        "norm.weight": torch.randn(48).to(dtype),  # whole
        "emb.weight": torch.randn(32, 48).to(dtype),  # whole, tied
    }
    sd["head.weight"] = sd["emb.weight"]
    return sd


PLAN = {"col.*": 0, "row.*": -1, "conv": 2}


def _equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a.contiguous()), bits(b.contiguous()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_slice_is_the_chunk_bit_for_bit_and_zero_copy(tmp_path, dtype, world,
                                                                 tsar_path):
    sd = _source(dtype)
    path = tmp_path / "tp.tsar"
    tsar.save(sd, path, tp=world, shard=PLAN)
    a = tsar.open(path)
    assert a.format_version == (1, 4) and a.tp_world == world
    dims = {i.name: i.shard_dim for i in a.infos()}
    assert dims == {"col.weight": 0, "row.weight": 1, "conv": 2, "norm.weight": None,
                    "emb.weight": None, "head.weight": None}
    lo, hi = a._a().data_ptr, a._a().data_ptr + a._a().mapped_size
    for name, dim in (("col.weight", 0), ("row.weight", 1), ("conv", 2)):
        for rank in range(world):
            s = a.shard(name, rank, world)
            assert _equal(s, torch.chunk(sd[name], world, dim)[rank]), (name, rank)
            # The rank's own run of the file: contiguous, inside the mapping,
            # starting on a 64-byte (page for big slices) boundary.
            assert s.is_contiguous() and lo <= s.data_ptr() < hi
            assert (s.data_ptr() - lo) % 64 == 0
        # Other world sizes: a multiple of the packed one is a view inside a
        # run, the rest a copy; both equal torch.chunk.
        for w in (world * 2, 3):
            for rank in range(len(torch.chunk(sd[name], w, dim))):
                assert _equal(a.shard(name, rank, w), torch.chunk(sd[name], w, dim)[rank])
    # Whole tensors: the full values (sharded ones as copies), ties kept.
    for name, want in sd.items():
        assert _equal(a[name], want), name
    assert a["emb.weight"].data_ptr() == a["head.weight"].data_ptr()
    assert not lo <= a["row.weight"].data_ptr() < hi  # split along dim 1: a copy
    assert a.info("emb.weight").storage == a.info("head.weight").storage
    # A tensor stored whole: a zero-copy strided view along any dim.
    s = a.shard("norm.weight", 1, world, 0)
    assert _equal(s, torch.chunk(sd["norm.weight"], world, 0)[1]) and lo <= s.data_ptr() < hi
    a.verify()


def test_a_sharded_tensor_whose_slices_are_its_c_order_bytes_is_whole_without_a_copy(
        tmp_path, tsar_path):
    sd = {"a": torch.randn(8, 16), "b": torch.randn(8, 18)}  # slices of 256 and 288 bytes
    tsar.save(sd, tmp_path / "tp.tsar", tp=2, shard={"*": 0})
    a = tsar.open(tmp_path / "tp.tsar")
    lo, hi = a._a().data_ptr, a._a().data_ptr + a._a().mapped_size
    assert _equal(a["a"], sd["a"]) and lo <= a["a"].data_ptr() < hi
    # 288 bytes take a 320-byte block: padding between the slices, so a copy
    assert _equal(a["b"], sd["b"]) and not lo <= a["b"].data_ptr() < hi


def test_an_archive_without_a_plan_gives_strided_views(tmp_path):
    sd = _source(torch.float32)
    tsar.save(sd, tmp_path / "plain.tsar")
    a = tsar.open(tmp_path / "plain.tsar")
    assert a.tp_world == 0 and a.format_version == (1, 0)
    s = a.shard("row.weight", 1, 4, 1)
    assert _equal(s, torch.chunk(sd["row.weight"], 4, 1)[1]) and not s.is_contiguous()
    with pytest.raises(tsar.Error, match="stores this tensor whole, so say which dimension"):
        a.shard("row.weight", 0, 2)
    with pytest.raises(tsar.Error, match="rank: expected 0 to 1, found 2"):
        a.shard("row.weight", 2, 2, 0)


class Mlp(torch.nn.Module):
    """A LLaMA MLP; with world > 1 a rank's part (gate/up split on dim 0, down on dim 1)."""

    def __init__(self, dim=48, hidden=64, world=1):
        super().__init__()
        self.gate = torch.nn.Linear(dim, hidden // world, bias=False)
        self.up = torch.nn.Linear(dim, hidden // world, bias=False)
        self.down = torch.nn.Linear(hidden // world, dim, bias=False)
        self.norm = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x = x * self.norm
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("planned", [True, False])
def test_ranks_bound_from_one_archive_sum_to_the_full_layer(tmp_path, planned):
    torch.manual_seed(1)
    full = Mlp().eval()
    path = tmp_path / "mlp.tsar"
    if planned:
        tsar.save(full, path, tp=4, shard={"gate.*": 0, "up.*": 0, "down.*": 1})
    else:
        tsar.save(full, path)
    x = torch.randn(5, 48)
    want = full(x)
    partial = []
    for rank in range(4):
        with torch.device("meta"):
            m = Mlp(world=4).eval()
        report = tsar.load_into(m, path, rank=rank, world=4)
        assert sorted(report.bound) == ["down.weight", "gate.weight", "norm", "up.weight"]
        assert _equal(m.down.weight, torch.chunk(full.down.weight, 4, 1)[rank])
        partial.append(m(x))
    torch.testing.assert_close(sum(partial), want, rtol=1e-5, atol=1e-5)
    # The full module binds from the TP archive too (sharded weights copied).
    whole = Mlp().eval()
    tsar.load_into(whole, path)
    assert torch.equal(whole(x), want)


def test_a_module_of_the_wrong_rank_shape_is_refused_naming_both_shapes(tmp_path):
    tsar.save(Mlp().eval(), tmp_path / "mlp.tsar", tp=2, shard={"gate.*": 0, "up.*": 0, "down.*": 1})
    m = Mlp(world=4).eval()
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, tmp_path / "mlp.tsar", rank=0, world=2)
    msg = str(e.value)
    assert "gate.weight: shape [16, 48] vs [32, 48], rank 0's slice of archive [64, 48] packed " \
           "sharded along dim 0" in msg
    assert "down.weight: shape [48, 16] vs [48, 32]" in msg
    with pytest.raises(tsar.Error, match="bind: rank: expected 0 to 1 for world 2, found 2"):
        tsar.load_into(Mlp(world=2).eval(), tmp_path / "mlp.tsar", rank=2, world=2)


def test_bad_plans_are_refused_naming_the_pattern_or_tensor(tmp_path):
    sd = _source(torch.float32)
    out = tmp_path / "x.tsar"
    with pytest.raises(tsar.Error, match=r'shard pattern "nothing\.\*": expected a pattern that matches'):
        tsar.save(sd, out, tp=2, shard={"col.*": 0, "nothing.*": 0})
    with pytest.raises(tsar.Error, match=r'tensor "col.weight" \(matched by "col.\*"\): dim: expected -2 to 1'):
        tsar.save(sd, out, tp=2, shard={"col.*": 2})
    with pytest.raises(tsar.Error, match=r'"norm.weight" .*size 48 of dim 0 \(shape \[48\]\): expected a multiple of tp 5'):
        tsar.save(sd, out, tp=5, shard={"norm.*": 0})
    with pytest.raises(tsar.Error, match="tp: expected 2 to 65536 ranks, found 1"):
        tsar.save(sd, out, tp=1, shard={"col.*": 0})
    with pytest.raises(tsar.Error, match="expected a C-contiguous tensor"):
        tsar.save({"t": torch.randn(4, 6).t()}, out, tp=2, shard={"t": 0})
    assert not out.exists()


def test_a_tied_weight_sharded_one_way_only_is_stored_twice_and_said(tmp_path):
    sd = _source(torch.float32)
    summary_notes = []
    tsar.save(sd, tmp_path / "t.tsar", tp=2, shard={"head.*": 0})
    a = tsar.open(tmp_path / "t.tsar")
    assert a.info("head.weight").shard_dim == 0 and a.info("emb.weight").shard_dim is None
    assert a.info("head.weight").storage != a.info("emb.weight").storage
    assert _equal(a["head.weight"], sd["emb.weight"]) and _equal(a["emb.weight"], sd["emb.weight"])
    del summary_notes


def _rank_rss(path, names, evict=True):
    """Rss of rank 2's slices (of 4) of `names`, read from a cold page cache
    (or from whatever the cache holds: `evict` False)."""
    if evict:
        evict_from_page_cache(path)
    with tsar.open(path) as a:
        for name, dim in names:
            a.shard(name, 2, 4, dim).sum().item()
        return smaps_of_file("self", path).get("Rss", 0) << 10


def test_a_rank_maps_only_its_own_runs_and_the_whole_tensors(tmp_path, tsar_path):
    # 4 ranks of 4 MiB slices. From the planned archive rank 2 maps its own
    # runs (8 MiB) and what the kernel maps around a fault (read-ahead into
    # large folios: up to 2 MiB at each edge); from an archive without a
    # plan its slice of "v" (split on dim 1) is a strided view that touches
    # every page of "v" (16 MiB).
    sd = {"w": torch.randn(4096, 1024), "v": torch.randn(1024, 4096)}
    planned, plain = tmp_path / "tp.tsar", tmp_path / "plain.tsar"
    tsar.save(sd, planned, tp=4, shard={"w": 0, "v": 1})
    tsar.save(sd, plain)
    names = (("w", 0), ("v", 1))
    per_rank = 2 * (4 << 20)
    rss_planned, rss_plain = _rank_rss(planned, names), _rank_rss(plain, names)
    assert per_rank <= rss_planned <= per_rank + 4 * (2 << 20), rss_planned
    # (less the pages of "v" before rank 2's first column and after its last)
    assert rss_plain >= (16 << 20) + (4 << 20) - (64 << 10), rss_plain
    assert rss_planned < 0.6 * rss_plain


def test_cli_packs_with_the_llama_plan_and_inspect_shows_it(tmp_path, cli):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    torch.save(model.state_dict(), tmp_path / "llama.pt")
    plan = os.path.join(REPO, "samples", "tp", "llama.plan.json")
    run_cli(cli, "pack", str(tmp_path / "llama.pt"), "--tp", "2", "--shard-plan", plan,
            "-o", str(tmp_path / "llama.tsar"), "-q")
    info = json.loads(run_cli(cli, "inspect", "--json", str(tmp_path / "llama.tsar")).stdout)
    tp = info["tensor_parallel"]
    assert tp["world"] == 2 and tp["by_dim"] == {"0": 12, "1": 4}  # 2 x (q k v gate up) + embed + head
    shard = {t["name"]: t.get("shard_dim") for t in info["tensors"]}
    assert shard["model.layers.1.mlp.down_proj.weight"] == 1
    assert shard["model.layers.0.self_attn.k_proj.weight"] == 0
    assert shard["model.norm.weight"] is None
    assert tp["rank_bytes"] == tp["replicated_bytes"] + tp["sharded_bytes"] // 2
    # The tied embedding and head share one sharded storage.
    a = tsar.open(tmp_path / "llama.tsar")
    assert a.info("lm_head.weight").storage == a.info("model.embed_tokens.weight").storage
    sd = model.state_dict()
    for name, want in sd.items():
        assert _equal(a[name], want), name
    out = run_cli(cli, "residency", str(tmp_path / "llama.tsar")).stdout
    assert "rank 1 of 2:" in out


def test_tsar_pack_takes_the_plan_and_repacking_without_it_gives_the_plain_archive(tmp_path):
    sd = _source(torch.bfloat16)
    torch.save(sd, tmp_path / "m.pt")
    tsar.pack(tmp_path / "m.pt", tmp_path / "tp.tsar", tp=2, shard=[("col.*", 0), ("row.*", 1)])
    a = tsar.open(tmp_path / "tp.tsar")
    assert a.tp_world == 2 and a.info("row.weight").shard_dim == 1
    assert _equal(a.shard("row.weight", 1, 2), torch.chunk(sd["row.weight"], 2, 1)[1])
    # A TP archive as input: repacked without a plan it is the plain archive,
    # byte for byte; with one, the same bytes as packing the source with it.
    tsar.pack(tmp_path / "tp.tsar", tmp_path / "again.tsar")
    tsar.pack(tmp_path / "m.pt", tmp_path / "plain.tsar")
    assert (tmp_path / "again.tsar").read_bytes() == (tmp_path / "plain.tsar").read_bytes()
    tsar.pack(tmp_path / "again.tsar", tmp_path / "tp2.tsar", tp=2, shard={"col.*": 0, "row.*": 1})
    assert (tmp_path / "tp2.tsar").read_bytes() == (tmp_path / "tp.tsar").read_bytes()
    with pytest.raises(TypeError, match="tp: expected the number of tensor-parallel ranks"):
        tsar.pack(tmp_path / "m.pt", tmp_path / "x.tsar", tp="2", shard={"col.*": 0})



def test_a_rank_read_right_after_packing_maps_only_its_own_runs(tmp_path, tsar_path):
    # Written, an archive's pages sit in the page cache in folios of up to
    # 2 MiB, and a fault maps a whole folio: each rank would map its
    # neighbours' slices and the padding too (slices of 1-3 MiB: 1.36x what a
    # rank needs, measured on kernel 6.18, ext4). A tensor-parallel pack
    # leaves the cache, so a rank that reads right after maps its own runs.
    torch.manual_seed(0)
    sd = {f"l{i}.{n}": torch.randn(*shape) for i in range(3)
          for n, shape in (("q", (1024, 1024)), ("up", (2816, 1024)), ("down", (1024, 2816)))}
    plan = {"*.q": 0, "*.up": 0, "*.down": 1}
    path = tmp_path / "tp.tsar"
    tsar.save(sd, path, tp=4, shard=plan)
    names = [(n, 1 if n.endswith("down") else 0) for n in sd]
    need = sum(t.numel() * 4 // 4 for t in sd.values())  # a quarter of every tensor
    rss = _rank_rss(path, names, evict=False)
    assert need <= rss <= 1.1 * need, (rss, need)

@pytest.mark.tsar_torch
def test_export_diff_and_verify_see_the_original_values(tmp_path, cli):
    safetensors = pytest.importorskip("safetensors.torch")
    sd = _source(torch.float32)
    torch.save(sd, tmp_path / "m.pt")
    tsar.save(sd, tmp_path / "tp.tsar", tp=4, shard=PLAN)
    tsar.save(sd, tmp_path / "plain.tsar")
    run_cli(cli, "verify", str(tmp_path / "tp.tsar"))
    out = run_cli(cli, "diff", str(tmp_path / "plain.tsar"), str(tmp_path / "tp.tsar")).stdout
    assert out.startswith("same:"), out
    run_cli(cli, "export", "-q", "--materialize-shared", str(tmp_path / "tp.tsar"), "-o",
            str(tmp_path / "tp.safetensors"))
    back = safetensors.load_file(str(tmp_path / "tp.safetensors"))
    for name in ("col.weight", "row.weight", "conv", "norm.weight"):
        assert _equal(back[name], sd[name]), name
    run_cli(cli, "export", "-q", str(tmp_path / "tp.tsar"), "-o", str(tmp_path / "tp.pt"))
    pt = torch.load(tmp_path / "tp.pt", weights_only=True)
    for name, want in sd.items():
        assert _equal(pt[name], want), name


def test_a_fine_tuned_variant_is_a_small_layer_over_a_tensor_parallel_base(tmp_path):
    sd = _source(torch.bfloat16)
    tsar.save(sd, tmp_path / "base.tsar", tp=2, shard=PLAN)
    ft = dict(sd, **{"norm.weight": sd["norm.weight"] + 1})
    tsar.save(ft, tmp_path / "ft.tsar", tp=2, shard=PLAN, base=tmp_path / "base.tsar")
    a = tsar.open(tmp_path / "ft.tsar")
    assert a.layers[1].endswith("base.tsar") and a.tp_world == 2
    # The variant stores only what changed; the sharded runs are the base's.
    assert os.path.getsize(tmp_path / "ft.tsar") < 4096
    for name, want in ft.items():
        assert _equal(a[name], want), name
    for rank in range(2):
        assert _equal(a.shard("row.weight", rank, 2), torch.chunk(ft["row.weight"], 2, 1)[rank])
    a.verify()


@pytest.mark.parametrize("args, words", [
    (["--shard", "a.weight"], '--shard "a.weight": expected PATTERN=DIM'),
    (["--tp", "2"], "--tp 2: expected --shard PATTERN=DIM or --shard-plan FILE"),
    (["--shard", "a.weight=0"], "--shard/--shard-plan: expected --tp W"),
    (["--tp", "2", "--shard-plan", "{missing}"], "missing.json: --shard-plan: cannot read the file"),
    (["--tp", "2", "--shard-plan", "{bad}"], 'bad.json: --shard-plan: expected an object {"tp": W'),
    (["--tp", "4", "--shard-plan", "{plan2}"], 'plan2.json: --tp 4 and the plan\'s "tp": 2 disagree'),
])
def test_cli_shard_arguments_are_refused_saying_what_was_expected(tmp_path, cli, args, words):
    torch.save({"a.weight": torch.zeros(4, 4)}, tmp_path / "m.pt")
    (tmp_path / "bad.json").write_text('{"shard": 3}')
    (tmp_path / "plan2.json").write_text('{"tp": 2, "shard": {"a.*": 0}}')
    paths = {"missing": tmp_path / "missing.json", "bad": tmp_path / "bad.json", "plan2": tmp_path / "plan2.json"}
    args = [a.format(**paths) for a in args]
    r = run_cli(cli, "pack", str(tmp_path / "m.pt"), "-o", str(tmp_path / "x.tsar"), *args, code=2)
    assert words in r.stderr, r.stderr
    assert not (tmp_path / "x.tsar").exists()
