"""Names in an input that the format cannot hold (issue 16, item 7): an empty
tensor name or one over 65,535 bytes is a bad input naming the input file
(exit 3, tsar.Error BAD_INPUT), not a usage error naming the output."""
import subprocess

import pytest

import tsar
from tsar_testutil import write_safetensors


@pytest.mark.parametrize("name, needle", [
    ("", 'tensor "": name: expected 1 to 65535 bytes, found 0'),
    ("w" * 65536, "name: expected at most 65535 bytes, found 65536"),
])
def test_a_name_the_format_cannot_hold_is_a_bad_input(cli, tmp_path, name, needle):
    src = tmp_path / "in.safetensors"
    write_safetensors(src, {n: ("F32", [], bytes(4)) for n in ["ok", name]})
    out = tmp_path / "out.tsar"
    r = subprocess.run([cli, "pack", str(src), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith(f"tsar: {src}: ") and needle in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    assert not out.exists()
    with pytest.raises(tsar.Error) as e:
        tsar.pack(src, out)
    assert e.value.code == tsar.ErrorCode.BAD_INPUT
    assert e.value.path == str(src)
    assert needle in str(e.value)

