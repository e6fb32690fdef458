"""python -m tsar: which path, and why, at a glance (issue 57 item 4)."""
import subprocess
import sys

import torch

import tsar
from tsar_testutil import child_env


def doctor(**env):
    e = child_env()
    e.pop("TSAR_PORTABLE", None)
    e.update(env)
    return subprocess.run([sys.executable, "-m", "tsar"], capture_output=True, text=True, env=e,
                          timeout=120)


def test_python_m_tsar_names_the_path_the_torch_and_the_way_to_the_accelerator():
    r = doctor(TSAR_PORTABLE="1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"tsar {tsar.__version__} (")
    assert f"torch {torch.__version__} (" in out
    assert "path: portable (" in out and "TSAR_PORTABLE is set" in out
    assert "the accelerator: built for torch" in out or "not built into this tsar" in out
    assert "\ntsar command: " in out and "\nHDF5 inputs: " in out


def test_python_m_tsar_names_the_path_a_process_beside_it_runs():
    r = doctor()
    assert r.returncode == 0, r.stderr
    # The same environment (TSAR_PORTABLE unset): the accelerator where it
    # serves this torch, whatever this test process runs.
    e = child_env()
    e.pop("TSAR_PORTABLE", None)
    backend = subprocess.run([sys.executable, "-c", "import tsar; print(tsar.backend())"],
                             capture_output=True, text=True, env=e, timeout=120).stdout.strip()
    assert backend.startswith(("accelerator (", "portable ("))
    assert f"path: {backend}" in r.stdout
    assert r.stdout.count("\n") >= 5


def test_python_m_tsar_help():
    e = child_env()
    r = subprocess.run([sys.executable, "-m", "tsar", "--help"], capture_output=True, text=True,
                       env=e, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m tsar")
