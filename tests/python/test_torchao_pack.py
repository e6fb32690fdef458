"""`tsar pack` of a torch.save file holding torchao tensors (issue 58): tsar's
restricted pickle reader (writer/pickle_torchao.cc) reads each torchao tensor
of a state_dict as the tensor group tsar.save would write for it (spec §4.13),
through tsar's C++ table (writer/torchao_table.cc), without torchao or Python
at pack time and without running anything from the pickle. For each of the
four CPU configurations, in bfloat16 and float32: the archive has the groups
tsar.save writes for the same state_dict, descriptions byte for byte but their
"version" (a pickle does not record which torchao wrote it: "unknown"), and
state_dict() gives each weight back bit for bit. What the table does not hold
stays as it was (an opaque object, its tensors loose) with a note, refused
under --strict. Also: the C++ table is python/tsar/_torchao.py's twin.
torchao is pinned in scripts/requirements.txt; beside the oldest torch, where
it does not install, these tests skip."""
import dataclasses
import importlib
import json
import os
import re

import pytest
import torch

import tsar
from tsar import _torchao
from tsar_testutil import REPO, bits, run_cli

torchao = pytest.importorskip("torchao", reason="torchao is not installed beside this torch")
from torchao.quantization import quantize_  # noqa: E402
from torchao_configs import CONFIGS  # noqa: E402
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _quantized(config, dtype, layers=1):
    torch.manual_seed(0)
    mods = [torch.nn.Linear(64, 32)]
    if layers == 2:
        mods += [torch.nn.ReLU(), torch.nn.Linear(32, 16)]
    m = torch.nn.Sequential(*mods).to(dtype).eval()
    quantize_(m, CONFIGS[config][0]())
    return m


def _groups(path, entry="model"):
    """{name: (members, sizes, strides, dtype, description as data, its text)}"""
    out = {}
    for name, members, sizes, strides, dtype, text in tsar.open(path)._a().groups(entry):
        out[name] = (list(members), list(sizes), list(strides), str(dtype), json.loads(text), text)
    return out


def _pack(cli, tmp_path, obj, *args, code=0):
    src, dst = tmp_path / "in.pt", tmp_path / "out.tsar"
    torch.save(obj, src)
    return run_cli(cli, "pack", src, "-o", dst, *args, code=code), dst


def _same_weight(got, want):
    assert type(got) is type(want)
    names, context = got.__tensor_flatten__()
    want_names, want_context = want.__tensor_flatten__()
    assert names == want_names and context == want_context
    for n in names:
        assert torch.equal(bits(getattr(got, n)), bits(getattr(want, n))), n
    assert torch.equal(bits(got.dequantize()), bits(want.dequantize()))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_pack_stores_each_torchao_weight_as_the_group_tsar_save_writes(cli, tmp_path, config,
                                                                       dtype):
    m = _quantized(config, DTYPES[dtype], layers=2)
    sd = m.state_dict()
    _, packed = _pack(cli, tmp_path, sd, "--strict")  # nothing opaque: --strict packs it
    saved = tmp_path / "saved.tsar"
    tsar.save(sd, saved)
    got, want = _groups(packed), _groups(saved)
    assert sorted(got) == ["0.weight", "2.weight"] and sorted(want) == sorted(got)
    for name, g in got.items():
        w = want[name]
        assert g[:4] == w[:4], name  # members, outer sizes, strides, dtype
        assert g[4]["class"] == CONFIGS[config][1] and g[4]["version"] == "unknown"
        assert {**g[4], "version": w[4]["version"]} == w[4]
        # Byte for byte but the version: what _torchao.describe() writes.
        assert g[5] == w[5].replace(json.dumps(w[4]["version"]), '"unknown"')
    # The plain tensors are plain tensors, in the state_dict's order.
    a = tsar.open(packed)
    assert list(a.state_dict()) == list(sd)
    # Rebuilt by tsar's Python reader: the same class, bit for bit, and the
    # model's outputs too.
    out = a.state_dict()
    for k, v in sd.items():
        if k.endswith("weight"):
            _same_weight(out[k], v)
        else:
            assert torch.equal(bits(out[k]), bits(v))
    x = torch.randn(3, 64, dtype=DTYPES[dtype])
    rebuilt = _quantized(config, DTYPES[dtype], layers=2)
    rebuilt.load_state_dict(out, assign=True)
    assert torch.equal(bits(rebuilt(x)), bits(m(x)))


def test_a_parameter_is_a_group_too(cli, tmp_path):
    # state_dict(keep_vars=True) holds the Parameters: their __dict__ adds _is_param.
    m = _quantized("int8_weight_only", torch.bfloat16, layers=2)
    sd = m.state_dict(keep_vars=True)
    assert getattr(sd["0.weight"], "_is_param", False)
    _, packed = _pack(cli, tmp_path, sd)
    assert sorted(_groups(packed)) == ["0.weight", "2.weight"]
    _same_weight(tsar.open(packed).state_dict()["2.weight"], sd["2.weight"].detach())


def test_outside_a_state_dict_a_weight_stays_opaque_with_a_note(cli, tmp_path):
    # A tree cannot name a group (spec §4.13.3): a torchao tensor in a list
    # stays a pickled object whose tensors are loose tensors, as before.
    sd = _quantized("int8_weight_only", torch.float32).state_dict()
    r, packed = _pack(cli, tmp_path, {"model": sd, "extra": [sd["0.weight"]]})
    assert '"extra.0": kept as an opaque pickle fragment, its tensors loose, not as a tensor ' \
           'group: a torchao Int8Tensor is stored as a tensor group only in a state_dict' \
           in r.stderr
    assert tsar.open(packed).entries == ["tensors", "model"]
    assert list(_groups(packed, "tensors")) == []  # extra.0.0, .1, .2
    assert list(_groups(packed)) == ["0.weight"]
    r, _ = _pack(cli, tmp_path, {"model": sd, "extra": [sd["0.weight"]]}, "--strict", code=3)
    assert "which --strict refuses (a torchao Int8Tensor is stored as a tensor group only" \
           in r.stderr


def test_a_class_the_table_lacks_stays_as_it_was_with_a_note(cli, tmp_path, monkeypatch):
    # A torchao tensor whose __dict__ holds a key tsar's table of its class
    # does not list: the state_dict is no longer one of tensors and groups,
    # so it is kept as before (pieces 0.weight.0, .1, .2), with the reason.
    sd = _quantized("int8_weight_only", torch.float32).state_dict()
    sd["0.weight"].extra_flag = 1
    r, packed = _pack(cli, tmp_path, sd)
    assert '"0.weight": kept as an opaque pickle fragment, its tensors loose, not as a tensor ' \
           'group: a torchao Int8Tensor: holds "extra_flag", which tsar\'s table of Int8Tensor ' \
           'does not list' in r.stderr
    assert _groups(packed) == {}
    r, _ = _pack(cli, tmp_path, sd, "--strict", code=3)
    assert 'holds "extra_flag"' in r.stderr


# The C++ twin of _torchao.py's tables: writer/torchao_table.cc, read here
# as C++ text (its rows are braced lists of strings, names and booleans).

def _cpp_table():
    text = open(os.path.join(REPO, "writer", "torchao_table.cc"), encoding="utf-8").read()
    consts = dict(re.findall(r'constexpr std::string_view (k\w+) = "([^"]*)";', text))

    def rows(start):
        body = text[text.index(start):]
        body = body[body.index("= {") + 2:body.index("};") + 1]
        tokens = re.findall(r'"(?:[^"\\]|\\.)*"\s*(?:"(?:[^"\\]|\\.)*"\s*)*|[{}]|[A-Za-z_][\w:]*',
                            body)
        stack = [[]]
        for t in tokens:
            if t == "{":
                stack.append([])
            elif t == "}":
                done = stack.pop()
                stack[-1].append(done)
            elif t.startswith('"'):
                stack[-1].append("".join(re.findall(r'"((?:[^"\\]|\\.)*)"', t)))
            else:
                stack[-1].append({"true": True, "false": False}.get(t, consts.get(t, t)))
        return stack[0][0]

    classes = {r[0]: r[1:6] for r in rows("std::vector<Class> table")}
    enums = {r[0]: tuple(r[1:]) for r in rows("std::vector<Named> enums")}
    records = {r[0]: tuple(r[1:]) for r in rows("std::vector<Named> records")}
    names = rows("constexpr std::string_view kNames[]")
    return classes, enums, records, names


def test_the_cpp_table_is_the_python_table():
    classes, enums, records, dtype_names = _cpp_table()
    assert classes == {k: [c.module, *map(list, c[1:])] for k, c in _torchao.CLASSES.items()}
    assert {k: v[0] for k, v in enums.items()} == {k: m for k, (m, _) in _torchao.ENUMS.items()}
    assert all(v[1:] == (False, []) for v in enums.values())
    assert {k: v[0] for k, v in records.items()} == {k: m for k, (m, _) in _torchao.RECORDS.items()}
    # What the C++ reads a record's pickle by: named tuple or dataclass, and
    # its fields, as the pinned torchao has them (_torchao.encode's).
    for key, (module, named_tuple, fields) in records.items():
        cls = getattr(importlib.import_module(module), key)
        if dataclasses.is_dataclass(cls):
            assert not named_tuple and fields == [f.name for f in dataclasses.fields(cls)], key
        else:
            assert named_tuple and fields == list(cls._fields), key
    # Every dtype of this torch, as str() names it (a pickle names it so).
    assert sorted(dtype_names) == sorted({str(d).replace("torch.", "") for d in vars(torch).values()
                                          if isinstance(d, torch.dtype)})
