"""Archives on a GPU (issue 29): Archive.state_dict(device=), load_into(device=).
Without a GPU the GPU tests skip, saying so, and the error is checked."""
import os

import pytest
import torch

import tsar
from tsar_testutil import DTYPES, bits

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device here: the GPU path is built and linked, "
                               "not run")


def _source():
    torch.manual_seed(0)
    sd = {f"t_{str(d).split('.')[-1]}": torch.randn(4, 8).to(d) if d.is_floating_point
          else torch.randint(0, 100, (4, 8)).to(d) for d in DTYPES
          if d not in (getattr(torch, "float4_e2m1fn_x2", None), torch.complex32, torch.complex64, torch.complex128,
                       torch.bool, torch.uint16, torch.uint32, torch.uint64)}
    sd["emb"] = torch.randn(16, 8)
    sd["head"] = sd["emb"]
    sd["part"] = sd["emb"][2:6]
    return sd


@pytest.mark.skipif(GPU, reason="checks the error where there is no GPU")
def test_without_a_gpu_device_is_refused_saying_why(tmp_path):
    tsar.save(_source(), tmp_path / "m.tsar")
    a = tsar.open(tmp_path / "m.tsar")
    with pytest.raises(tsar.Error, match="no CUDA device/driver is present"):
        a.state_dict(device="cuda")
    assert a.state_dict(device="cpu").keys() == a.state_dict().keys()
    with pytest.raises(tsar.Error, match="no CUDA device/driver"):
        tsar.load_into(torch.nn.Linear(2, 2).eval(), a, device="cuda:0")


@needs_gpu
@pytest.mark.parametrize("pinned", [64 << 10, 64 << 20])
def test_every_storage_arrives_bytes_exact_with_ties_as_views(tmp_path, pinned):
    sd = _source()
    tsar.save(sd, tmp_path / "m.tsar")
    got = tsar.open(tmp_path / "m.tsar").state_dict(device="cuda", pinned_bytes=pinned)
    _assert_arrived(got, sd)


def _assert_arrived(got, sd):
    """Every tensor of `sd` on the GPU bytes exact, ties and views as views of one storage."""
    for name, want in sd.items():
        g = got[name]
        assert g.is_cuda and g.dtype == want.dtype and g.shape == want.shape, name
        assert torch.equal(bits(g.cpu()), bits(want)), name
    assert got["emb"].untyped_storage().data_ptr() == got["head"].untyped_storage().data_ptr()
    assert got["part"].untyped_storage().data_ptr() == got["emb"].untyped_storage().data_ptr()


@needs_gpu
def test_a_meta_module_and_a_tensor_parallel_archive_load_onto_the_gpu(tmp_path):
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    tsar.save(ref, tmp_path / "tp.tsar", tp=2, shard={"0.weight": 0, "2.weight": 1})
    with torch.device("meta"):
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    tsar.load_into(m, tmp_path / "tp.tsar", device="cuda")
    for (name, got), want in zip(m.state_dict().items(), ref.state_dict().values()):
        assert got.is_cuda and torch.equal(got.cpu(), want), name  # the weights, bytes exact
    x = torch.randn(3, 16).cuda()
    assert torch.equal(m(x), ref.cuda()(x))  # GPU against GPU: the same kernels


@needs_gpu
def test_load_into_a_gpu_keeps_the_parameter_objects_and_their_ties(tmp_path):
    torch.manual_seed(2)
    ref = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32, bias=False)).eval()
    ref[1].weight = ref[0].weight  # tied
    tsar.save(ref, tmp_path / "tied.tsar")
    with torch.device("meta"):
        m = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32, bias=False)).eval()
    m[1].weight = m[0].weight
    m[0].register_buffer("scale", torch.ones(3), persistent=False)  # not in the archive
    before = {n: id(p) for n, p in m.named_parameters(remove_duplicate=False)}
    tsar.load_into(m, tmp_path / "tied.tsar", device="cuda")
    assert {n: id(p) for n, p in m.named_parameters(remove_duplicate=False)} == before
    assert m[1].weight is m[0].weight and m[0].weight.is_cuda
    assert m[0].scale.is_cuda  # the whole module is on the GPU
    assert torch.equal(m[0].weight.cpu(), ref[0].weight)
    ids = torch.tensor([1, 7, 31]).cuda()
    assert torch.equal(m(ids), ref.cuda()(ids))  # GPU against GPU


@needs_gpu
def test_a_rank_of_a_tensor_parallel_archive_loads_onto_the_gpu(tmp_path):
    torch.manual_seed(3)
    full = torch.nn.Linear(16, 32, bias=False).eval()
    tsar.save(full, tmp_path / "tp.tsar", tp=2, shard={"weight": 0})
    for rank in range(2):
        with torch.device("meta"):
            m = torch.nn.Linear(16, 16, bias=False).eval()
        tsar.load_into(m, tmp_path / "tp.tsar", rank=rank, world=2, device="cuda")
        assert m.weight.is_cuda
        assert torch.equal(m.weight.cpu(), full.weight.chunk(2, 0)[rank])


@needs_gpu
def test_a_module_with_meta_buffers_is_refused_before_any_copy_to_the_gpu(tmp_path):
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.register_buffer("pos", torch.arange(4), persistent=False)

    tsar.save(Positions(), tmp_path / "p.tsar")
    with torch.device("meta"):
        m = Positions().eval()
    with pytest.raises(tsar.Error, match="non-persistent buffers") as e:
        tsar.load_into(m, tmp_path / "p.tsar", device="cuda")
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH and "pos" in str(e.value)
    assert m.fc.weight.is_meta and m.pos.is_meta
    with tsar.empty_parameters():
        m = Positions().eval()
    tsar.load_into(m, tmp_path / "p.tsar", device="cuda")
    assert m.fc.weight.is_cuda and m.pos.is_cuda and torch.equal(m.pos.cpu(), torch.arange(4))


@needs_gpu
def test_a_transformers_model_with_empty_parameters_onto_the_gpu_equals_from_pretrained(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    sd = __import__("safetensors.torch").torch.load_file(tmp_path / "hf" / "model.safetensors")
    tsar.save(sd, tmp_path / "llama.tsar")
    with tsar.empty_parameters():
        m = transformers.LlamaForCausalLM(config)
    report = tsar.load_into(m.eval(), tmp_path / "llama.tsar", device="cuda")  # strict
    assert report.tied == ["lm_head.weight"] and m.lm_head.weight is m.model.embed_tokens.weight
    ref = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval().cuda()
    ids = torch.tensor([[1, 5, 9, 77]]).cuda()
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)  # GPU against GPU


@pytest.mark.skipif(GPU, reason="checks the error where there is no GPU")
def test_pin_register_without_a_gpu_is_refused_and_a_bad_pin_named(tmp_path):
    tsar.save(_source(), tmp_path / "m.tsar")
    a = tsar.open(tmp_path / "m.tsar")
    with pytest.raises(tsar.Error, match="no CUDA device") as e:
        a.state_dict(device="cuda", pin="register")
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED and a.registration_seconds is None
    with pytest.raises(ValueError, match="pin: expected"):
        a.state_dict(device="cuda", pin="lock")
    with pytest.raises(ValueError, match="stage_from: expected 'file' or 'mapping', found 'disk'"):
        a.state_dict(device="cuda", stage_from="disk")
    with pytest.raises(ValueError, match="pin: expected one of 'stage', 'register', found 'lock'"):
        tsar.load_into(torch.nn.Linear(2, 2).eval(), a, device="cuda", pin="lock")
    assert a.device_stats is None


def _big_source():
    """Several storages, 4 MiB and more, a tie and a view among them."""
    torch.manual_seed(7)
    sd = {"emb": torch.randn(1024, 1024), "w": torch.randn(3000, 701).to(torch.bfloat16),
          "small": torch.ones(3)}
    sd["head"] = sd["emb"]
    sd["part"] = sd["emb"][2:6]
    return sd


@needs_gpu
@pytest.mark.parametrize("pin", ["stage", "register"])
def test_every_pin_arrives_bytes_exact_and_says_what_it_did(tmp_path, pin):
    sd = _big_source()
    tsar.save(sd, tmp_path / "m.tsar")
    a = tsar.open(tmp_path / "m.tsar")
    total = sd["emb"].nbytes + sd["w"].nbytes + sd["small"].nbytes
    for _ in range(2):  # with "register": the first load locks the mapping, the second reuses it
        got = a.state_dict(device="cuda", pin=pin)
        _assert_arrived(got, sd)
        s = a.device_stats
        assert s["bytes"] == total, s
        if pin == "stage":
            assert s["bytes_direct"] == 0 and s["pinned_bytes"] > 0, s
            assert s["bytes_from_file"] == total, s  # staged by pread of the file
        else:  # every byte read from the locked mapping, none staged
            assert s["bytes_direct"] == total and s["pinned_bytes"] == 0, s
    assert (a.registration_seconds is not None) == (pin == "register")
    if pin == "register":  # a later load with the default pin reads the locked mapping too
        _assert_arrived(a.state_dict(device="cuda"), sd)
        assert a.device_stats["bytes_direct"] == total


@needs_gpu
def test_staging_reads_the_file_or_the_mapping_and_a_private_mapping_from_memory(tmp_path):
    sd = _big_source()
    tsar.save(sd, tmp_path / "m.tsar")
    total = sd["emb"].nbytes + sd["w"].nbytes + sd["small"].nbytes
    a = tsar.open(tmp_path / "m.tsar")
    _assert_arrived(a.state_dict(device="cuda", stage_from="mapping"), sd)
    assert a.device_stats["bytes"] == total and a.device_stats["bytes_from_file"] == 0
    with pytest.raises(ValueError, match="stage_from: expected 'file' or 'mapping', found 'disk'"):
        a.state_dict(device="cuda", stage_from="disk")
    # copy-on-write: the process's own write to the mapping is what arrives
    c = tsar.open(tmp_path / "m.tsar", mode="copy_on_write")
    c["small"].fill_(5.0)
    got = c.state_dict(device="cuda")
    assert torch.equal(got["small"].cpu(), torch.full((3,), 5.0))
    assert c.device_stats["bytes_from_file"] == 0


@needs_gpu
def test_load_into_with_pin_register_twice_keeps_the_parameter_objects_and_their_ties(tmp_path):
    torch.manual_seed(4)
    ref = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64, bias=False)).eval()
    ref[1].weight = ref[0].weight
    tsar.save(ref, tmp_path / "t.tsar")
    a = tsar.open(tmp_path / "t.tsar")
    for _ in range(2):  # a second replica: its load reuses the locked mapping
        with tsar.empty_parameters():
            m = torch.nn.Sequential(torch.nn.Embedding(64, 16),
                                    torch.nn.Linear(16, 64, bias=False)).eval()
        m[1].weight = m[0].weight
        p = m[0].weight
        tsar.load_into(m, a, device="cuda", pin="register")
        assert m[0].weight is p and m[1].weight is p and p.is_cuda
        assert torch.equal(p.cpu(), ref[0].weight)
        assert a.registration_seconds is not None


@needs_gpu
def test_pin_register_copies_from_the_registered_mapping_bytes_exact_and_releases(tmp_path):
    sd = _source()
    tsar.save(sd, tmp_path / "m.tsar")
    a = tsar.open(tmp_path / "m.tsar")
    assert a.registration_seconds is None
    for _ in range(2):  # the first load registers, the second reuses it
        got = a.state_dict(device="cuda", pin="register")
        assert a.registration_seconds is not None and a.registration_seconds >= 0
        _assert_arrived(got, sd)
    a.close()
    assert a.registration_seconds is None


@needs_gpu
def test_two_processes_that_register_one_archive_still_share_its_pages(tmp_path):
    import subprocess
    import sys
    from tsar_testutil import child_env
    torch.manual_seed(5)
    tsar.save({"w": torch.randn(16 << 20)}, tmp_path / "big.tsar")  # 64 MiB
    child = (
        "import sys, torch, tsar\n"
        "from tsar_testutil import smaps_of_file\n"
        "a = tsar.open(sys.argv[1])\n"
        "a.state_dict(device='cuda', pin='register')\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "m = smaps_of_file('self', sys.argv[1])\n"
        "print(m.get('Rss', 0), m.get('Pss', 0), flush=True)\n"
        "sys.stdin.readline()\n")
    env = child_env()
    env["PYTHONPATH"] += os.pathsep + os.path.dirname(os.path.abspath(__file__))
    procs = [subprocess.Popen([sys.executable, "-c", child, str(tmp_path / "big.tsar")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        sizes = [tuple(map(int, p.stdout.readline().split())) for p in procs]
        for rss, pss in sizes:
            assert rss >= 60 << 10, sizes  # every page of the tensor is mapped (locked)...
            assert pss <= 0.6 * rss, sizes  # ...and shared by both processes
    finally:
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
            p.wait(timeout=60)
