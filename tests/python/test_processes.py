"""Several processes share one copy of an archive; a write into a shared
mapping kills the process with SIGSEGV (and, with the fault handler, says why)."""
import os
import signal
import subprocess
import sys

import torch

import tsar
from tsar_testutil import child_env, release_holders, run_python, smaps_of_file, smaps_rollup

HOLDER = r"""
import sys, tsar
a = tsar.open(sys.argv[1], mode="shared")
total = 0.0
for name, t in a.state_dict().items():   # touches every page of every storage
    total += float(t.sum())
print("ready", repr(total), flush=True)
sys.stdin.readline()                      # block until the parent is done measuring
"""


def test_four_processes_share_one_copy(tmp_path):
    path = str(tmp_path / "big.tsar")
    g = torch.Generator().manual_seed(0)
    sd = {f"w{i}": torch.rand(2 * 1024 * 1024, generator=g) for i in range(4)}  # 4 x 8 MiB
    tsar.save(sd, path)
    size = os.path.getsize(path)
    assert 32 << 20 <= size < (32 << 20) + (1 << 20)
    want = sum(float(t.sum()) for t in sd.values())
    procs = []
    try:
        for _ in range(4):
            procs.append(subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=child_env()))
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("ready "), f"child {p.pid} failed: {line!r} {p.stderr.read() if p.poll() is not None else ''}"
            assert abs(float(line.split()[1]) - want) <= 1e-6 * abs(want)
        pss_sum = 0
        for p in procs:
            archive = smaps_of_file(p.pid, path)
            rollup = smaps_rollup(p.pid)
            rss, pss = archive.get("Rss", 0) * 1024, archive.get("Pss", 0) * 1024
            assert rss >= size - 4096, f"child {p.pid}: Rss of the archive {rss} < file size {size}"
            assert archive.get("Private_Dirty", 0) == 0, "nothing of the archive is copied"
            assert rollup["Pss"] * 1024 >= pss and rollup["Rss"] >= archive["Rss"]
            pss_sum += pss
        assert pss_sum <= 1.1 * size, f"summed Pss {pss_sum} is more than one copy of {size}"
        assert pss_sum >= 0.9 * size, f"summed Pss {pss_sum}: the archive should be resident once"
    finally:
        release_holders(procs)
    assert [p.returncode for p in procs] == [0, 0, 0, 0]


WRITER = r"""
import sys, tsar
if sys.argv[3] == "handler":
    tsar.install_fault_handler()
a = tsar.open(sys.argv[1], mode=sys.argv[2])
w = a["weights"]
w.add_(1)
print("survived", float(w.sum()), flush=True)
"""


def writer_archive(tmp_path):
    path = str(tmp_path / "ro.tsar")
    tsar.save({"bias": torch.zeros(3), "weights": torch.zeros(64 * 1024)}, path)
    return path


def test_write_to_shared_archive_is_sigsegv(tmp_path):
    path = writer_archive(tmp_path)
    r = run_python(WRITER, path, "shared", "plain")
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)
    assert "survived" not in r.stdout
    assert "tsar: write to read-only archive" not in r.stderr


def test_fault_handler_names_the_archive_and_tensor(tmp_path):
    path = writer_archive(tmp_path)
    before = open(path, "rb").read()
    r = run_python(WRITER, path, "shared", "handler")
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)
    assert "survived" not in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tsar: write to read-only archive ")]
    assert len(lines) == 1, r.stderr
    assert path in lines[0] and '"weights"' in lines[0], lines[0]
    assert open(path, "rb").read() == before


def test_write_to_copy_on_write_archive_is_fine(tmp_path):
    path = writer_archive(tmp_path)
    before = open(path, "rb").read()
    r = run_python(WRITER, path, "copy_on_write", "handler")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["survived", str(float(64 * 1024))]
    assert open(path, "rb").read() == before
