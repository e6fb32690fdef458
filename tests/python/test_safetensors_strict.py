"""The safetensors importer is as strict as the format's reference reader (issue
11): whatever the reference reader refuses, `tsar pack` refuses with exit 3 and
a message naming the input, so two tools never disagree on which tensors a file
holds. Files are written byte by byte here, the way the reference writer lays
them out (8-byte length, JSON padded with spaces, tensors back to back)."""
import json
import struct
import subprocess

import pytest

import tsar


def write(path, header, data, pad=b" ", prefix=b""):
    text = prefix + json.dumps(header, separators=(",", ":")).encode()
    text += pad * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def two_tensors(a_offsets=(0, 8), b_offsets=(8, 16)):
    return {"a": {"dtype": "F32", "shape": [2], "data_offsets": list(a_offsets)},
            "b": {"dtype": "I32", "shape": [2], "data_offsets": list(b_offsets)}}


def pack(cli, src, tmp_path):
    out = tmp_path / "out.tsar"
    r = subprocess.run([cli, "pack", str(src), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode != 0 or out.exists()
    return r, out


def refused(cli, src, tmp_path, needle):
    r, out = pack(cli, src, tmp_path)
    assert r.returncode == 3, r.stderr
    assert str(src) in r.stderr and needle in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()


def test_well_formed_file_packs(cli, tmp_path):
    src = write(tmp_path / "ok.safetensors", two_tensors(), bytes(16))
    r, out = pack(cli, src, tmp_path)
    assert r.returncode == 0, r.stderr
    with tsar.open(out) as a:
        assert sorted(a.keys()) == ["a", "b"]


@pytest.mark.parametrize("tail", [b"\0", b"\0\0\0\0\0\0\0", b'\0,"c":1}'])
def test_nul_in_the_header_is_refused(cli, tmp_path, tail):
    text = json.dumps(two_tensors(), separators=(",", ":")).encode() + tail
    text += b" " * ((8 - len(text) % 8) % 8)
    src = tmp_path / "nul.safetensors"
    src.write_bytes(struct.pack("<Q", len(text)) + text + bytes(16))
    refused(cli, src, tmp_path, "header: expected JSON text, found a NUL byte")


def test_a_gap_between_tensors_is_refused(cli, tmp_path):
    src = write(tmp_path / "gap.safetensors", two_tensors((0, 8), (12, 20)), bytes(20))
    refused(cli, src, tmp_path, 'tensor "b": data_offsets: expected begin 8 (the end of tensor "a"), '
                                "found [12, 20]: 4 bytes that no tensor holds")


def test_a_first_offset_other_than_zero_is_refused(cli, tmp_path):
    src = write(tmp_path / "first.safetensors", two_tensors((4, 12), (12, 20)), bytes(20))
    refused(cli, src, tmp_path, 'tensor "a": data_offsets: expected begin 0 (the start of the data)')


def test_trailing_bytes_are_refused(cli, tmp_path):
    src = write(tmp_path / "trailing.safetensors", two_tensors(), bytes(24))
    refused(cli, src, tmp_path, "found 8 bytes after the last tensor that no tensor holds")


def test_overlap_is_refused(cli, tmp_path):
    src = write(tmp_path / "overlap.safetensors", two_tensors((0, 8), (4, 12)), bytes(12))
    refused(cli, src, tmp_path, "overlapping bytes")


def test_header_starting_with_whitespace_says_so(cli, tmp_path):
    src = write(tmp_path / "space.safetensors", two_tensors(), bytes(16), prefix=b"  ")
    refused(cli, src, tmp_path, "header: expected '{' as its first byte")


def test_number_overflow_names_the_file(cli, tmp_path):
    text = b'{"a":{"dtype":"F32","shape":[44e4444444],"data_offsets":[0,8]}}'
    text += b" " * ((8 - len(text) % 8) % 8)
    src = tmp_path / "overflow.safetensors"
    src.write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
    refused(cli, src, tmp_path, "header: expected valid JSON, found number overflow parsing '44e4444444'")


@pytest.mark.parametrize("name,needle", [("", "name"), ("n" * 65536, "65535")])
def test_bad_tensor_names_are_bad_input(cli, tmp_path, name, needle):
    header = {name: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    src = write(tmp_path / "names.safetensors", header, bytes(8))
    refused(cli, src, tmp_path, needle)


def test_empty_tensors_tile_at_their_position(cli, tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]},
              "b": {"dtype": "I32", "shape": [2], "data_offsets": [8, 16]}}
    src = write(tmp_path / "empty.safetensors", header, bytes(16))
    r, out = pack(cli, src, tmp_path)
    assert r.returncode == 0, r.stderr
    with tsar.open(out) as a:
        assert a.info("e").shape == (0, 3)
