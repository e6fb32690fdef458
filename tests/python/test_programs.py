"""Programs inside an archive (issue 60): a torch.export program or an
AOTInductor package stored without its weights (spec §4.7.2), checked against
the archive's tensors when packed, bound zero copy by tsar.load_program /
tsar.load_aoti; what a hostile archive's program cannot make tsar run."""
import io
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

import tsar
from tsar import _programs as P
from tsar_testutil import child_env, in_mapping, mapped_ranges, run_python, smaps_of_file

if P.unsupported(aoti=True):
    pytest.skip(P.unsupported(aoti=True), allow_module_level=True)

X = torch.randn(5, 16, generator=torch.Generator().manual_seed(1))


class Model(torch.nn.Module):
    def __init__(self, out=4, hidden=32):
        super().__init__()
        self.m = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(),
                                     torch.nn.Linear(hidden, out))
        self.m.register_buffer("scale", torch.arange(float(out)))
        self.register_buffer("freq", torch.linspace(0, 1, out), persistent=False)

    def forward(self, x):
        return self.m(x) * self.m.scale + self.freq


def model(seed=0, **kw):
    torch.manual_seed(seed)
    return Model(**kw).eval()


def export(m):
    return torch.export.export(m, (torch.ones(2, 16),),
                               dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))


def members(archive_path, name="model"):
    with tsar.open(archive_path) as a:
        return zipfile.ZipFile(io.BytesIO(a.file(f"programs/{name}.pt2")))


def test_exported_program_binds_every_weight_zero_copy(tmp_path, tsar_path):
    m = model()
    path = tmp_path / "m.tsar"
    tsar.save(m, path, programs={"model": export(m)})
    module = tsar.load_program(path)
    with torch.no_grad():
        assert torch.equal(module(X), m(X))
    ranges = mapped_ranges(path)
    weights = dict(module.named_parameters())
    weights.update(module.named_buffers())
    stored = set(m.state_dict())
    assert set(weights) >= stored
    for name in stored:  # every parameter and persistent buffer is the file's bytes
        assert in_mapping(weights[name].data_ptr(), ranges), name
    # freq (not in the state_dict) is the program's own constant, a private copy.
    assert not in_mapping(weights["freq"].data_ptr(), ranges)


def test_the_program_is_stored_without_its_weights(tmp_path):
    m = model(hidden=4096)  # 256 KiB of weights
    path = tmp_path / "m.tsar"
    tsar.save(m, path, programs={"model": export(m)})
    z = members(path)
    names = z.namelist()
    assert not [n for n in names if "/data/weights/weight_" in n]
    assert any(n.endswith("data/weights/model_weights_config.json") for n in names)
    sample = [n for n in names if n.endswith("data/sample_inputs/model.pt")]
    assert sample and z.read(sample[0]) == b""  # the example inputs (a pickle) left out
    weight_bytes = sum(t.numel() * t.element_size() for t in m.state_dict().values())
    with tsar.open(path) as a:
        assert len(a.file("programs/model.pt2")) < weight_bytes / 8
        stamp = json.loads(a.metadata()["program:model"])
    assert stamp["kind"] == "exported" and stamp["entry"] == "model"
    assert stamp["torch_version"] == torch.__version__
    assert ["m.0.weight", "float32", [4096, 16]] in stamp["weights"]


def test_pack_takes_a_pt2_file_and_is_deterministic(tmp_path, tsar_path):
    m = model()
    torch.export.save(export(m), tmp_path / "m.pt2")
    torch.save(m.state_dict(), tmp_path / "w.pt")
    a, b = tmp_path / "a.tsar", tmp_path / "b.tsar"
    summary = tsar.pack(tmp_path / "w.pt", a, programs={"model": tmp_path / "m.pt2"})
    assert any("stored without their weights" in n for n in summary.notes)
    tsar.pack(tmp_path / "w.pt", b, programs={"model": tmp_path / "m.pt2"})
    assert a.read_bytes() == b.read_bytes()
    # An ExportedProgram object (serialized by torch with a random id) too.
    tsar.save(m, tmp_path / "c.tsar", programs={"model": export(m)})
    tsar.save(m, tmp_path / "d.tsar", programs={"model": export(m)})
    assert (tmp_path / "c.tsar").read_bytes() == (tmp_path / "d.tsar").read_bytes()
    with torch.no_grad():
        assert torch.equal(tsar.load_program(a)(X), m(X))


def test_a_program_that_does_not_fit_the_weights_is_refused_before_publishing(tmp_path):
    other = model(out=8)
    torch.save(model().state_dict(), tmp_path / "w.pt")
    out = tmp_path / "out.tsar"
    with pytest.raises(tsar.Error) as e:
        tsar.pack(tmp_path / "w.pt", out, programs={"model": export(other)})
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "m.2.weight: shape [8, 32] expected, found [4, 32]" in str(e.value)
    assert "m.scale" in str(e.value)
    assert not out.exists() and os.listdir(tmp_path) == ["w.pt"]  # nothing published, no temp
    with pytest.raises(tsar.Error) as e:
        tsar.save(model(), out, programs={"model": export(model())}, program_entry="absent")
    assert e.value.code == tsar.ErrorCode.NOT_FOUND and not out.exists()
    with pytest.raises(tsar.Error) as e:
        tsar.save(model(), out, programs={"../x": export(model())})
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT


def test_a_foreign_aoti_package_is_refused(tmp_path):
    zipfile.ZipFile(tmp_path / "p.pt2", "w").writestr("p/data/aotinductor/model/x.so", b"\x7fELF")
    with pytest.raises(tsar.Error) as e:
        tsar.save(model(), tmp_path / "m.tsar", programs={"model": tmp_path / "p.pt2"})
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED and "tsar.compile_aoti" in str(e.value)


# --- a hostile archive -----------------------------------------------------------------

def repacked(tmp_path, edit, name="evil.tsar"):
    """model()'s archive with its program's members edited by ``edit(files)``,
    written as a packer that skips tsar's checks would write it."""
    m = model()
    good = tmp_path / "good.tsar"
    tsar.save(m, good, programs={"model": export(m)})
    with tsar.open(good) as a:
        files = P.members(a.file("programs/model.pt2"), "x")
        stamp = a.metadata()["program:model"]
    edit(files)
    path = tmp_path / name
    tsar.save(m, path, metadata={"file:programs/model.pt2": P.zip_bytes(files),
                                 "program:model": stamp})
    return path


def one(files, suffix):
    return [n for n in files if n.endswith(suffix)][0]


def test_guard_code_and_example_inputs_in_the_file_never_run(tmp_path):
    marker = tmp_path / "ran"
    payload = f"open({str(marker)!r}, 'w').write('x')"

    class Evil:
        def __reduce__(self):
            return (exec, (payload,))

    def edit(files):
        j = one(files, "models/model.json")
        program = json.loads(files[j])
        program["guards_code"] = [payload]
        files[j] = json.dumps(program).encode()
        buf = io.BytesIO()
        torch.save((Evil(),), buf)
        files[one(files, "data/sample_inputs/model.pt")] = buf.getvalue()

    module = tsar.load_program(repacked(tmp_path, edit))
    with torch.no_grad():
        assert torch.equal(module(X), model()(X))
    assert not marker.exists()


def test_pickled_weights_and_constants_are_refused(tmp_path):
    def pickled_weight(files):
        c = one(files, "data/weights/model_weights_config.json")
        config = json.loads(files[c])
        config["config"]["m.0.weight"]["use_pickle"] = True
        files[c] = json.dumps(config).encode()

    with pytest.raises(tsar.Error) as e:
        tsar.load_program(repacked(tmp_path, pickled_weight))
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED and "'m.0.weight'" in str(e.value)

    def custom_object(files):
        c = one(files, "data/constants/model_constants_config.json")
        config = json.loads(files[c])
        for meta in config["config"].values():
            meta["path_name"] = "custom_obj_0"
            meta["use_pickle"] = True
        files[c] = json.dumps(config).encode()

    with pytest.raises(tsar.Error) as e:
        tsar.load_program(repacked(tmp_path, custom_object, "b.tsar"))
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED


@pytest.mark.parametrize("edit,code,says", [
    (lambda f: f.__setitem__(one(f, "data/constants/tensor_0"), b"\0" * 8), "BAD_INPUT",
     "past the payload"),
    (lambda f: f.pop(one(f, "data/weights/model_weights_config.json")), "BAD_INPUT",
     "model_weights_config.json"),
    (lambda f: f.__setitem__(one(f, "models/model.json"), b"{not json"), "BAD_INPUT", "models/model.json"),
])
def test_malformed_programs_are_named_errors(tmp_path, edit, code, says):
    with pytest.raises(tsar.Error) as e:
        tsar.load_program(repacked(tmp_path, edit))
    assert e.value.code.name == code and says in str(e.value), str(e.value)
    assert "program 'model'" in str(e.value)


def test_oversized_members_are_refused_before_they_are_read(tmp_path, monkeypatch):
    path = repacked(tmp_path, lambda f: None)
    monkeypatch.setattr(P, "_MEMBER_LIMIT", 1000)
    with pytest.raises(tsar.Error) as e:
        tsar.load_program(path)
    assert e.value.code == tsar.ErrorCode.BAD_INPUT and "over tsar's limit" in str(e.value)


def stamped(tmp_path, change, name="s.tsar"):
    m = model()
    good = tmp_path / "good.tsar"
    tsar.save(m, good, programs={"model": export(m)})
    with tsar.open(good) as a:
        md = {k: v for k, v in a.metadata().items() if k.startswith(("file:", "program:"))}
    stamp = json.loads(md["program:model"])
    change(stamp)
    md["program:model"] = json.dumps(stamp) if isinstance(stamp, dict) else stamp
    tsar.save(m, tmp_path / name, metadata=md)
    return tmp_path / name


def test_the_stamp_is_checked(tmp_path):
    newer = stamped(tmp_path, lambda s: s.update(torch_version="99.0.0"))
    with pytest.raises(tsar.Error) as e:
        tsar.load_program(newer)
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED
    assert "made with torch 99.0.0" in str(e.value) and "torch_match='any'" in str(e.value)
    with torch.no_grad():
        assert torch.equal(tsar.load_program(newer, torch_match="any")(X), model()(X))
    older = stamped(tmp_path, lambda s: s.update(torch_version="2.0.0"), "o.tsar")
    tsar.load_program(older)  # torch reads older programs
    with pytest.raises(tsar.Error) as e:
        tsar.load_program(older, torch_match="exact")
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED
    aoti = stamped(tmp_path, lambda s: s.update(kind="aoti"), "k.tsar")
    with pytest.raises(tsar.Error) as e:
        tsar.load_program(aoti, name="model")
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT and "tsar.load_aoti" in str(e.value)
    entry = stamped(tmp_path, lambda s: s.update(entry="nope"), "e.tsar")
    with pytest.raises(tsar.Error) as e:
        tsar.load_program(entry)
    assert e.value.code == tsar.ErrorCode.BAD_INPUT and "'nope'" in str(e.value)
    with pytest.raises(tsar.Error) as e:
        tsar.load_program(tmp_path / "good.tsar", name="other")
    assert e.value.code == tsar.ErrorCode.NOT_FOUND and "model" in str(e.value)
    tsar.save(model(), tmp_path / "plain.tsar")
    with pytest.raises(tsar.Error) as e:
        tsar.load_program(tmp_path / "plain.tsar")
    assert e.value.code == tsar.ErrorCode.NOT_FOUND and "programs=" in str(e.value)


# --- processes -------------------------------------------------------------------------

SERVE = """
import sys, torch, tsar
module = tsar.load_program(sys.argv[1])
with torch.no_grad():
    y = module(torch.ones(3, 1024))
print("ready", float(y.sum()), "transformers" in sys.modules, flush=True)
sys.stdin.read()
"""


def test_processes_share_one_copy(tmp_path, tsar_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 4096)).eval()  # 80 MiB
    ep = torch.export.export(m, (torch.ones(2, 1024),),
                             dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    path = tmp_path / "big.tsar"
    tsar.save(m, path, programs={"model": ep})
    env = child_env()
    if tsar_path == "portable":
        env["TSAR_PORTABLE"] = "1"
    procs = [subprocess.Popen([sys.executable, "-c", SERVE, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        lines = [p.stdout.readline().split() for p in procs]
        with torch.no_grad():
            want = float(m(torch.ones(3, 1024)).sum())
        for line in lines:
            assert line[0] == "ready" and float(line[1]) == want and line[2] == "False"
        weights_kib = os.path.getsize(path) / 1024
        pss = [smaps_of_file(p.pid, path).get("Pss", 0) for p in procs]
        rss = [smaps_of_file(p.pid, path).get("Rss", 0) for p in procs]
        # Each maps (and touched) every weight page; together they hold one copy.
        assert min(rss) > 0.9 * weights_kib
        assert sum(pss) < 1.1 * weights_kib, (pss, weights_kib)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)


# --- AOTInductor (one compile for the module: tens of seconds on 2 cores) ---------------

@pytest.fixture(scope="module")
def aoti_archive(tmp_path_factory):
    d = tmp_path_factory.mktemp("aoti")
    m = model()
    ep = export(m)
    package = tsar.compile_aoti(ep, d / "m.aoti.pt2")
    path = d / "m.tsar"
    tsar.save(m, path, programs={"model": ep, "model_aoti": package})
    return path, package


def test_aoti_binds_the_archives_tensors(aoti_archive):
    path, package = aoti_archive
    m = model()
    compiled = tsar.load_aoti(path)
    # The same code given the module's own tensors (as torch's loader is
    # used without tsar) computes exactly the same.
    from torch._inductor import aoti_load_package

    own = aoti_load_package(str(package))
    held = {**dict(m.named_parameters()), **dict(m.named_buffers())}
    own.load_constants({k: held[k].detach() for k in own.get_constant_fqns()},
                       check_full_update=True, user_managed=True)
    with torch.no_grad():
        assert torch.equal(compiled(X), own(X))
        assert torch.allclose(compiled(X), m(X), atol=1e-5)
    ranges = mapped_ranges(path)
    assert sorted(compiled.bound) == sorted(m.state_dict())
    assert all(in_mapping(t.data_ptr(), ranges) for t in compiled.bound.values())
    assert compiled.private_constant_bytes == 16  # freq: 4 floats, outside the state_dict


def test_aoti_reads_the_mapping_itself(aoti_archive):
    path, _ = aoti_archive
    archive = tsar.open(path, mode="copy_on_write")
    compiled = tsar.load_aoti(archive)
    with torch.no_grad():
        before = compiled(X).clone()
        compiled.bound["m.2.bias"].add_(1.0)  # 4 elements: inductor would inline them
        assert torch.allclose(compiled(X) - before, torch.arange(4.0).expand_as(before))


def test_aoti_stamp_names_torch_and_cpu(aoti_archive, tmp_path):
    path, _ = aoti_archive
    with tsar.open(path) as a:
        md = {k: v for k, v in a.metadata().items() if k.startswith(("file:", "program:"))}
    stamp = json.loads(md["program:model_aoti"])
    assert stamp["kind"] == "aoti" and stamp["machine"] and stamp["cpu_isa"] is not None
    assert stamp["torch_version"] == torch.__version__

    def with_stamp(**change):
        out = tmp_path / f"{'_'.join(change)}.tsar"
        tsar.save(model(), out, metadata={**md, "program:model_aoti": json.dumps({**stamp, **change})})
        return out

    with pytest.raises(tsar.Error) as e:
        tsar.load_aoti(with_stamp(torch_version="2.1.0"))
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED and "needs torch 2.1.x" in str(e.value)
    with pytest.raises(tsar.Error) as e:
        tsar.load_aoti(with_stamp(machine="riscv64"))
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED and "riscv64" in str(e.value)
    from tsar import _programs_load

    flags = _programs_load.cpu_flags() or set()
    if "amx_tile" not in flags and flags:
        with pytest.raises(tsar.Error) as e:
            tsar.load_aoti(with_stamp(cpu_isa="AVX2 AMX_TILE"))
        assert e.value.code == tsar.ErrorCode.UNSUPPORTED and "AMX_TILE" in str(e.value)
    with pytest.raises(tsar.Error) as e:
        tsar.load_aoti(path, name="model")
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT and "tsar.load_program" in str(e.value)


def test_aoti_in_a_process_without_transformers(aoti_archive):
    path, _ = aoti_archive
    r = run_python("import sys, torch, tsar\n"
                   "c = tsar.load_aoti(sys.argv[1])\n"
                   "print(float(c(torch.ones(2, 16)).sum()), 'transformers' in sys.modules)",
                   path)
    assert r.returncode == 0, r.stderr
    with torch.no_grad():
        want = float(model()(torch.ones(2, 16)).sum())
    got, imported = r.stdout.split()
    assert abs(float(got) - want) < 1e-4 and imported == "False"


# --- a transformers directory, exported at pack time ----------------------------------

LOGITS = """
import sys, torch, tsar
model = tsar.load_program(sys.argv[1], sys.argv[2])
ids = torch.tensor([[1, 17, 200, 42, 7, 250, 3], [5, 6, 7, 8, 9, 10, 11]])
mask = torch.ones_like(ids)
mask[1, :3] = 0  # a padded row
with torch.no_grad():
    torch.save(model(ids, mask), sys.argv[3])
print("transformers" in sys.modules)
"""


def test_transformers_directory_exported_at_pack_time_runs_without_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    import tsar.transformers as tt

    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True)).eval()
    m.save_pretrained(tmp_path / "dir")
    out = tmp_path / "m.tsar"
    r = subprocess.run([sys.executable, "-m", "tsar.transformers", "pack", str(tmp_path / "dir"),
                        "-o", str(out), "--program", "exported"],
                       capture_output=True, text=True, env=child_env(), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "programs: model (exported" in r.stderr
    with tsar.open(out) as a:
        assert "lm_head.weight" not in a.keys()  # tied: stored once, as save_pretrained does
        assert set(a.files()) >= {"config.json", "programs/model.pt2"}
    r = run_python(LOGITS, out, "model", tmp_path / "logits.pt")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]  # no transformers in that process
    ids = torch.tensor([[1, 17, 200, 42, 7, 250, 3], [5, 6, 7, 8, 9, 10, 11]])
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "dir").eval()
    with torch.no_grad():
        want = reference(ids, attention_mask=mask).logits
    assert torch.equal(torch.load(tmp_path / "logits.pt"), want)  # bit-exact
    with pytest.raises(tsar.Error) as e:
        tt.pack(tmp_path / "dir", tmp_path / "x.tsar", program="onnx")
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT and not (tmp_path / "x.tsar").exists()
