"""torch.save zips are read with minizip (writer/zip_reader.h), and a record is
taken only when every place that states its size and name agrees (issue 16,
item 6): the central directory (what torch.load reads), the local header, the
data descriptor that torch.save writes after each record, and data.pkl. Files
are real torch.save output, patched byte by byte."""
import struct
import subprocess
import warnings
import zipfile

import pytest
import torch

import tsar


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "z.pt"
    torch.save({"x": torch.ones(3), "y": torch.arange(4, dtype=torch.int64)}, path)
    return path


def cd_entry(data, name):
    """Offset of the central directory entry of `name`."""
    pos = data.find(b"PK\x01\x02")
    while pos >= 0:
        n = struct.unpack_from("<H", data, pos + 28)[0]
        if data[pos + 46:pos + 46 + n] == name.encode():
            return pos
        pos = data.find(b"PK\x01\x02", pos + 1)
    raise KeyError(name)


def local_header(data, name):
    cd = cd_entry(data, name)
    return struct.unpack_from("<I", data, cd + 42)[0]


def records(path):
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def rezip_deflating_pkl(src, dst):
    """`src`'s records written again, data.pkl deflated (sizes in the local header)."""
    with zipfile.ZipFile(dst, "w") as z:
        for name, data in records(src):
            z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if name.endswith(".pkl")
                       else zipfile.ZIP_STORED)
    return dst


def pack(cli, src, tmp_path):
    out = tmp_path / "out.tsar"
    r = subprocess.run([cli, "pack", str(src), "-o", str(out)], capture_output=True, text=True)
    return r, out


def test_untouched_file_packs(cli, saved, tmp_path):
    r, out = pack(cli, saved, tmp_path)
    assert r.returncode == 0, r.stderr
    with tsar.open(out) as a:
        assert torch.equal(a.tensor("y"), torch.arange(4))


def test_central_directory_understating_a_record_is_refused(cli, saved, tmp_path):
    data = bytearray(saved.read_bytes())
    cd = cd_entry(data, "z/data/1")
    assert struct.unpack_from("<II", data, cd + 20) == (32, 32)
    struct.pack_into("<II", data, cd + 20, 16, 16)  # compressed, uncompressed
    saved.write_bytes(data)
    r, out = pack(cli, saved, tmp_path)
    assert r.returncode == 3, r.stderr
    assert 'zip record "z/data/1": expected 32 bytes (numel x element size from data.pkl), ' \
           "the central directory gives 16" in r.stderr
    assert not out.exists()


def test_data_descriptor_disagreeing_with_the_directory_is_refused(cli, saved, tmp_path):
    data = bytearray(saved.read_bytes())
    h = local_header(data, "z/data/1")
    name_len, extra_len = struct.unpack_from("<HH", data, h + 26)
    end = h + 30 + name_len + extra_len + 32
    assert data[end:end + 4] == b"PK\x07\x08"
    struct.pack_into("<I", data, end + 12, 16)  # uncompressed size
    saved.write_bytes(data)
    r, out = pack(cli, saved, tmp_path)
    assert r.returncode == 3, r.stderr
    assert 'zip record "z/data/1": expected a data descriptor after the data that agrees' in r.stderr
    assert not out.exists()


def test_local_header_naming_another_record_is_refused(cli, saved, tmp_path):
    data = bytearray(saved.read_bytes())
    h = local_header(data, "z/data/1")
    assert data[h + 30:h + 38] == b"z/data/1"
    data[h + 37:h + 38] = b"0"
    saved.write_bytes(data)
    r, out = pack(cli, saved, tmp_path)
    assert r.returncode == 3, r.stderr
    assert 'zip record "z/data/1": the local header names "z/data/0"' in r.stderr
    assert not out.exists()


def test_a_name_twice_in_the_directory_is_refused(cli, saved, tmp_path):
    dup = tmp_path / "dup.pt"
    with warnings.catch_warnings(), zipfile.ZipFile(dup, "w") as z:
        warnings.simplefilter("ignore")
        for name, data in records(saved) + [("z/data/1", bytes(32))]:
            z.writestr(name, data)
    r, out = pack(cli, dup, tmp_path)
    assert r.returncode == 3, r.stderr
    assert 'zip record "z/data/1": appears twice in the central directory' in r.stderr


def test_corrupt_deflated_data_pkl_is_refused(cli, saved, tmp_path):
    bad = rezip_deflating_pkl(saved, tmp_path / "crc.pt")
    raw = bytearray(bad.read_bytes())
    cd = cd_entry(raw, "z/data.pkl")
    crc = struct.unpack_from("<I", raw, cd + 16)[0]
    struct.pack_into("<I", raw, cd + 16, crc ^ 1)
    h = local_header(raw, "z/data.pkl")
    struct.pack_into("<I", raw, h + 14, crc ^ 1)
    bad.write_bytes(raw)
    r, _ = pack(cli, bad, tmp_path)
    assert r.returncode == 3, r.stderr
    assert 'zip record "z/data.pkl": its CRC-32 does not match its content' in r.stderr
    # Deflated data.pkl with the right CRC packs: compression is allowed for the
    # structure, only tensor records must be stored (they are mapped).
    ok = rezip_deflating_pkl(saved, tmp_path / "deflated.pt")
    r, out = pack(cli, ok, tmp_path)
    assert r.returncode == 0, r.stderr
    with tsar.open(out) as a:
        assert torch.equal(a.tensor("x"), torch.ones(3))
