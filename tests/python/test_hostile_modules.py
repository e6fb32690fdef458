"""Modules that are not what they say, bound on both paths (issue 56, items 2,
3, 6, 7, 9, 10, 15, 16): subclasses whose properties lie or run code that
changes the module while the walk or the bind holds it, modules reused on
many paths, two threads building empty models, training after a read-only
bind. A crash would take the test process with it, so each hostile bind runs
in a child of its own, under PYTHONMALLOC=debug (freed objects are
overwritten: a use after free reads garbage and fails loudly)."""
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import tsar
from tsar_testutil import child_env


def run_child(code, path, *args, malloc="debug", timeout=120):
    env = child_env()
    # Under ASan (tests/torch_tests.cmake: python.hostile_asan) Python's own
    # allocator is off, so that ASan sees every free.
    env["PYTHONMALLOC"] = os.environ.get("TSAR_TEST_PYTHONMALLOC", malloc)
    if path == "portable":
        env["TSAR_PORTABLE"] = "1"
    else:
        env.pop("TSAR_PORTABLE", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


# Each case: a module whose walk or bind runs Python that drops the module's
# other tensors (their last references: the model holds them nowhere else).
# The bind must finish (or refuse with tsar.Error), and every tensor it bound
# must hold the archive's values.
HOSTILE = r'''
import gc, sys
import torch, tsar

path = sys.argv[1]
case = sys.argv[2]
torch.manual_seed(0)

def make():
    return torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])

tsar.save(make(), path)
want = make()
tsar.load_into(want.eval(), path)
want = {k: v.clone() for k, v in want.state_dict().items()}

model = make().eval()
fired = []

def vandal():
    # Drops every other module's tensors and submodules, then collects.
    if fired:
        return
    fired.append(1)
    for i in range(1, len(model)):
        model[i]._parameters.clear()
        model[i]._buffers.clear()
    model._modules.clear()
    gc.collect()

class Liar(torch.nn.Parameter):
    # Every attribute the portable bind used to read through getattr.
    @property
    def is_meta(self):
        vandal()
        return False
    @property
    def shape(self):
        vandal()
        return torch.Size([8, 8])

class Training:
    def __bool__(self):
        vandal()
        return False

class Hooks(dict):
    def __len__(self):
        vandal()
        return 0
    def __bool__(self):
        vandal()
        return False

class Meta(type(torch.nn.Module)):
    def __getattribute__(cls, name):
        if name == "state_dict":
            vandal()
        return super().__getattribute__(name)

class Key:
    # A non-str key in a module's __dict__ whose hash collides with an
    # attribute the walk reads: a lookup of that attribute runs its __eq__.
    def __hash__(self):
        return hash("_parameters")
    def __eq__(self, other):
        vandal()
        return False

class Collide(str):
    # A set member whose hash collides with a buffer's name: the set's
    # lookup runs its __eq__.
    def __hash__(self):
        return hash("scale")
    def __eq__(self, other):
        vandal()
        return False

first = model[0]
if case == "liar_parameter":
    w = first.weight
    first._parameters["weight"] = Liar(w.detach(), requires_grad=False)
elif case == "training_object":
    first.__dict__["training"] = Training()
elif case == "hook_dict":
    first.__dict__["_state_dict_hooks"] = Hooks()
elif case == "metaclass":
    Sneaky = Meta("Sneaky", (torch.nn.Linear,), {})
    first.__class__ = Sneaky
elif case == "dict_key":
    first.__dict__[Key()] = 1
elif case == "set_member":
    first.register_buffer("scale", torch.ones(1))
    first._non_persistent_buffers_set.add(Collide("x"))
    model2 = make()
    model2[0].register_buffer("scale", torch.ones(1))
    tsar.save(model2, path)
    want = make()
    want[0].register_buffer("scale", torch.ones(1))
    tsar.load_into(want.eval(), path)
    want = {k: v.clone() for k, v in want.state_dict().items()}
else:
    raise SystemExit("unknown case " + case)

try:
    report = tsar.load_into(model, path, strict=False)
except tsar.Error as e:
    print("refused:", e)
    raise SystemExit(0)
gc.collect()
checked = 0
for name in report.bound:
    assert name in want, name
    checked += 1
# What is still in the model holds the archive's values.
for name, t in model.state_dict().items():
    if name in want:
        torch.testing.assert_close(torch.Tensor.clone(t), want[name], rtol=0, atol=0)
print("bound", checked, "fired", len(fired))
'''

CASES = ["liar_parameter", "training_object", "hook_dict", "metaclass", "set_member", "dict_key"]


@pytest.mark.parametrize("case", CASES)
def test_code_run_by_the_walk_or_bind_that_drops_tensors_crashes_nothing(tmp_path, case,
                                                                         tsar_path):
    r = run_child(HOSTILE, tsar_path, tmp_path / "m.tsar", case)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-3000:])
    assert r.stdout.startswith(("bound ", "refused:")), r.stdout
    assert "Fatal Python error" not in r.stderr


class Lying(torch.nn.Parameter):
    """A Parameter whose properties claim another shape or dtype than it has."""
    claim_shape = None
    claim_dtype = None

    @property
    def shape(self):
        real = torch.Tensor.shape.__get__(self)
        return self.claim_shape if self.claim_shape is not None else real

    @property
    def dtype(self):
        real = torch.Tensor.dtype.__get__(self)
        return self.claim_dtype if self.claim_dtype is not None else real


@pytest.mark.parametrize("lie", ["shape", "dtype"])
def test_a_parameter_that_lies_about_its_shape_or_dtype_is_refused(tmp_path, lie, tsar_path):
    archive = tmp_path / "m.tsar"
    tsar.save({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}, archive)
    m = torch.nn.Module()
    if lie == "shape":  # really [12] float32, claims [3, 4]
        p = Lying(torch.zeros(12), requires_grad=False)
        p.claim_shape = torch.Size([3, 4])
    else:  # really [3, 4] float64, claims float32
        p = Lying(torch.zeros(3, 4, dtype=torch.float64), requires_grad=False)
        p.claim_dtype = torch.float32
    m.register_parameter("w", p)
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m.eval(), archive)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert ("shape [12] vs archive [3, 4]" if lie == "shape"
            else "dtype float64 vs archive float32") in str(e.value)
    assert torch.equal(torch.Tensor.clone(p), torch.zeros(12) if lie == "shape"
                       else torch.zeros(3, 4, dtype=torch.float64))


def reused(levels):
    """A module tree where each level holds one submodule twice: 2**levels paths."""
    leaf = torch.nn.Linear(2, 2)
    for _ in range(levels):
        parent = torch.nn.Module()
        parent.a = leaf
        parent.b = leaf
        leaf = parent
    return leaf


def test_a_module_reused_on_many_paths_is_refused_fast(tmp_path, tsar_path):
    archive = tmp_path / "m.tsar"
    tsar.save({"w": torch.zeros(2)}, archive)
    # 2**30 names: state_dict() would run out of memory after minutes.
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(reused(30).eval(), archive)
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert "reached on many paths" in str(e.value)


def test_a_module_reused_on_a_few_paths_binds_under_every_name(tmp_path, tsar_path):
    archive = tmp_path / "m.tsar"
    torch.manual_seed(1)
    src = reused(3)
    tsar.save(src, archive)
    m = reused(3).eval()
    report = tsar.load_into(m, archive)
    names = list(src.state_dict().keys())
    assert len(names) == 16 and sorted(report.bound) == sorted(names)
    assert torch.equal(m.a.b.a.weight, src.a.a.a.weight)


def test_a_non_tensor_in_parameters_is_named(tmp_path, tsar_path):
    archive = tmp_path / "m.tsar"
    tsar.save(torch.nn.Linear(2, 2), archive)
    m = torch.nn.Linear(2, 2).eval()
    m._parameters["bias"] = 3
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, archive)
    assert e.value.code == tsar.ErrorCode.INVALID_ARGUMENT
    assert "'bias' is a int in the module's _parameters" in str(e.value)
    assert "Invoked with" not in str(e.value)  # no pybind signature dump


def test_training_refusal_speaks_of_optimizers_not_only_batchnorm(tmp_path, tsar_path):
    archive = tmp_path / "m.tsar"
    tsar.save(torch.nn.Linear(2, 2), archive)
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(torch.nn.Linear(2, 2).train(), archive)
    assert "optimizer" in str(e.value) and "copy_on_write" in str(e.value)


TRAIN_AFTER_READ_ONLY_BIND = r'''
import sys
import torch, tsar
path = sys.argv[1]
tsar.save(torch.nn.Sequential(torch.nn.Linear(4, 4)), path)
model = torch.nn.Sequential(torch.nn.Linear(4, 4))
tsar.load_into(model.eval(), path)          # the README's path
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(2, 4)).sum().backward()
opt.step()                                    # writes the read-only weights
print("not reached")
'''


def test_training_after_a_read_only_bind_dies_with_a_message(tmp_path, tsar_path):
    archive = tmp_path / "m.tsar"
    r = run_child(TRAIN_AFTER_READ_ONLY_BIND, tsar_path, archive, malloc="pymalloc")
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stderr[-2000:])
    assert "not reached" not in r.stdout
    assert f"tsar: write to read-only archive {archive}" in r.stderr
    assert 'tensor "0.' in r.stderr
    assert 'mode="copy_on_write"' in r.stderr and "optimizer" in r.stderr
    assert "call eval()" not in r.stderr  # the old advice, wrong after train()


class Flattened(torch.Tensor):
    """A wrapper subclass made of an inner tensor (as torchao's quantized
    weights are): no storage of its own."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

    def __init__(self, inner):
        self.inner = inner

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Flattened(inner["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.inner if isinstance(x, Flattened) else x  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


def test_saving_a_tensor_subclass_made_of_inner_tensors_names_it(tmp_path, tsar_path):
    m = torch.nn.Linear(4, 4)
    del m.weight
    m.register_buffer("weight", Flattened(torch.ones(4, 4)))
    with pytest.raises(tsar.Error) as e:
        tsar.save(m, tmp_path / "q.tsar")
    assert e.value.code == tsar.ErrorCode.UNSUPPORTED
    assert "'weight'" in str(e.value) and "Flattened" in str(e.value)
    assert not (tmp_path / "q.tsar").exists()


def test_empty_parameters_in_two_threads_that_leave_out_of_order():
    a_in, b_in, a_out, b_built = (threading.Event() for _ in range(4))
    got = {}

    def a():
        with tsar.empty_parameters():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with tsar.empty_parameters():
            b_in.set()
            a_out.wait(10)  # A has left; B is still inside
            got["b"] = torch.nn.Linear(3, 3)
        b_built.set()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got["b"].weight.is_meta and got["b"].bias.is_meta
    # Outside, in any thread: real parameters again.
    assert not torch.nn.Linear(2, 2).weight.is_meta


def test_empty_parameters_leaves_other_threads_alone():
    inside, done = threading.Event(), threading.Event()

    def holder():
        with tsar.empty_parameters():
            inside.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    inside.wait(10)
    try:
        assert not torch.nn.Linear(2, 2).weight.is_meta  # this thread is not inside
    finally:
        done.set()
        t.join(10)


def test_register_parameter_of_a_non_parameter_is_torchs_type_error():
    with tsar.empty_parameters():
        with pytest.raises(TypeError):
            torch.nn.Module().register_parameter("x", 3)


def test_errors_are_named_as_the_docs_name_them(tmp_path):
    with pytest.raises(tsar.Error) as e:
        tsar.open(tmp_path / "missing.tsar")
    assert type(e.value).__module__ == "tsar" and type(e.value).__qualname__ == "Error"
    import traceback
    assert "tsar.Error: " in "".join(traceback.format_exception_only(type(e.value), e.value))


class WithPositions(torch.nn.Module):
    """A module that computes a buffer older checkpoints of it stored (BERT's
    embeddings.position_ids)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("position_ids", torch.arange(5), persistent=False)


def test_a_stored_non_persistent_buffer_is_named_as_one(tmp_path, tsar_path):
    archive = tmp_path / "m.tsar"
    sd = dict(WithPositions().state_dict(), position_ids=torch.arange(5))
    tsar.save(sd, archive)
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(WithPositions().eval(), archive)
    assert e.value.code == tsar.ErrorCode.BIND_MISMATCH
    assert "not in module: position_ids" in str(e.value)
    assert "the module holds position_ids as non-persistent buffers" in str(e.value)
    assert "strict=False" in str(e.value)
    m = WithPositions().eval()
    report = tsar.load_into(m, archive, strict=False)
    assert report.unexpected == ["position_ids"]
    assert sorted(report.bound) == ["lin.bias", "lin.weight"]


def test_a_meta_non_persistent_buffer_the_archive_holds_is_not_said_to_be_in_no_archive(
        tmp_path, tsar_path):
    archive = tmp_path / "m.tsar"
    tsar.save(dict(WithPositions().state_dict(), position_ids=torch.arange(5)), archive)
    with torch.device("meta"):
        m = WithPositions().eval()
    with pytest.raises(tsar.Error) as e:
        tsar.load_into(m, archive, strict=False)
    assert "position_ids (non-persistent buffers" in str(e.value)
    assert "no archive holds" not in str(e.value)
