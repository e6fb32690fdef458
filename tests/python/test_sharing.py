"""Tied weights and views: stored once, loaded sharing one storage again."""
import os

import torch

import tsar
from tsar_testutil import all_parameters, in_mapping, mapped_ranges, reference_decoder, same_tensor


class Tied(torch.nn.Module):
    """head.weight is emb.weight; `part` and `tr` are views of the buffer `base`."""

    def __init__(self, vocab=1000, dim=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight
        base = torch.arange(24.0)
        self.register_buffer("base", base)
        self.register_buffer("part", base[4:12].view(2, 4))
        self.register_buffer("tr", base[:12].view(3, 4).t())

    def forward(self, ids):
        return self.head(self.emb(ids)) + self.tr.sum()


def storage_ptr(t):
    return t.storage().data_ptr()


def tied_model(seed=0):
    torch.manual_seed(seed)
    return Tied().eval()


def test_tied_and_views_come_back_shared(tmp_path):
    m = tied_model()
    path = str(tmp_path / "tied.tsar")
    tsar.save(m, path)
    with tsar.open(path) as a:
        assert a.keys() == list(m.state_dict()) == ["base", "part", "tr", "emb.weight", "head.weight"]
        info = {n: a.info(n) for n in a.keys()}
        assert info["emb.weight"].storage == info["head.weight"].storage
        assert info["base"].storage == info["part"].storage == info["tr"].storage
        assert info["emb.weight"].storage != info["base"].storage
        assert info["part"].storage_offset == 4 and info["tr"].strides == (1, 4)
        sd = a.state_dict()
    assert storage_ptr(sd["emb.weight"]) == storage_ptr(sd["head.weight"])
    assert sd["emb.weight"].data_ptr() == sd["head.weight"].data_ptr()
    assert storage_ptr(sd["base"]) == storage_ptr(sd["part"]) == storage_ptr(sd["tr"])
    assert sd["part"].data_ptr() == sd["base"].data_ptr() + 4 * 4
    for name, want in m.state_dict().items():
        assert same_tensor(sd[name], want) == "", name


def test_shared_storages_are_stored_once(tmp_path):
    m = tied_model()
    tied = str(tmp_path / "tied.tsar")
    clones = str(tmp_path / "clones.tsar")
    tsar.save(m, tied)
    tsar.save({k: v.clone() for k, v in m.state_dict().items()}, clones)
    ref = reference_decoder()
    r_tied = ref.decode(open(tied, "rb").read(), tied)
    r_clones = ref.decode(open(clones, "rb").read(), clones)
    assert len(r_tied["storages"]) == 2
    assert len(r_clones["storages"]) == 5
    emb_bytes = m.emb.weight.numel() * 4
    assert os.path.getsize(clones) - os.path.getsize(tied) >= emb_bytes
    # The storage of base is stored whole once (24 floats), not once per view.
    base_storage = r_tied["tensors"][2]["storage"]
    assert r_tied["storages"][base_storage][1] == 24 * 4


def test_copy_on_write_write_is_seen_through_every_view(tmp_path):
    m = tied_model()
    path = str(tmp_path / "tied.tsar")
    tsar.save(m, path)
    before = open(path, "rb").read()
    a = tsar.open(path, mode="copy_on_write")
    assert a.mode == "copy_on_write"
    sd = a.state_dict()
    assert sd["emb.weight"].requires_grad  # as saved (a Parameter)
    with torch.no_grad():
        sd["emb.weight"][3, 5] = 42.0
        assert sd["head.weight"][3, 5].item() == 42.0
        sd["base"][5] = -1.0
        assert sd["part"][0, 1].item() == -1.0        # part = base[4:12].view(2, 4)
        assert sd["tr"][1, 1].item() == -1.0          # tr = base[:12].view(3, 4).t()
        sd["tr"][2, 0] = -2.0                          # base[2]
        assert sd["base"][2].item() == -2.0
    a.close()
    assert open(path, "rb").read() == before, "copy_on_write must never change the file"
    with tsar.open(path) as fresh:
        assert fresh["base"][5].item() == 5.0


def test_load_into_keeps_ties(tmp_path):
    path = str(tmp_path / "tied.tsar")
    tsar.save(tied_model(seed=0), path)
    m = tied_model(seed=1)
    assert m.head.weight is m.emb.weight
    ids_before = {n: id(p) for n, p in all_parameters(m).items()}
    assert set(ids_before) == {"emb.weight", "head.weight"}
    report = tsar.load_into(m, path)
    assert set(report.bound) >= {"emb.weight", "base", "part", "tr"}
    assert set(report.bound) <= {"emb.weight", "head.weight", "base", "part", "tr"}
    assert report.missing == [] and report.unexpected == [] and report.mismatched == []
    assert m.head.weight is m.emb.weight
    assert {n: id(p) for n, p in all_parameters(m).items()} == ids_before
    ranges = mapped_ranges(path)
    assert ranges, "the archive is not mapped in this process"
    assert in_mapping(m.emb.weight.data_ptr(), ranges)
    assert storage_ptr(m.base) == storage_ptr(m.part) == storage_ptr(m.tr)
    assert in_mapping(m.tr.data_ptr(), ranges)
    want = tied_model(seed=0)
    ids = torch.tensor([[1, 5, 999]])
    with torch.no_grad():
        assert torch.equal(m(ids), want(ids))
