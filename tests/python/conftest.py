"""Fixtures of the tsar Python tests. Environment (set by ctest):
PYTHONPATH  the built package (build/python)
TSAR_CLI    the `tsar` executable; tests that need it fail (not skip) without it
TSAR_SAMPLES  samples/ of the source tree (valid/, invalid/MANIFEST.tsv); defaults
            to the samples/ next to these tests."""
import os
import sys

import pytest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import tsar_testutil  # noqa: E402


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("TSAR_CLI")
    if not path:
        pytest.fail("TSAR_CLI is not set: it must name the tsar executable (e.g. build/cli/tsar)")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"TSAR_CLI={path!r} is not an executable file")
    return path


@pytest.fixture(scope="session")
def samples():
    path = os.environ.get("TSAR_SAMPLES") or os.path.join(tsar_testutil.REPO, "samples")
    manifest = os.path.join(path, "invalid", "MANIFEST.tsv")
    if not os.path.isfile(manifest):
        pytest.fail(f"TSAR_SAMPLES={path!r}: no invalid/MANIFEST.tsv there")
    return path


def _paths():
    from tsar import _backend

    return ["accelerator", "portable"] if _backend.accelerator is not None else ["portable"]


def _on_portable(monkeypatch):
    from tsar import _backend

    monkeypatch.setattr(_backend, "accelerator", None)
    monkeypatch.setattr(_backend, "why_portable", "TSAR_PORTABLE is set")


@pytest.fixture
def portable(monkeypatch):
    """This process on the portable path (as beside another torch)."""
    _on_portable(monkeypatch)


@pytest.fixture(params=_paths())
def tsar_path(request, monkeypatch):
    """Each of tsar's paths in turn: this process on it, and its name
    ("accelerator" or "portable", for children, which choose it by
    TSAR_PORTABLE)."""
    if request.param == "portable":
        _on_portable(monkeypatch)
    return request.param


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "accelerator: a test of what the accelerator (tsar._tsar, linked to LibTorch) "
        "does and the portable path does not (no test today), skipped where this process runs "
        "the portable path (tsar.backend()): beside another torch than tsar's build, or with "
        "TSAR_PORTABLE=1")
    config.addinivalue_line(
        "markers", "tsar_torch: a test that needs tsar-torch, the LibTorch half of the tsar "
        "command (TorchScript inputs, --arch, export to .pt), skipped where it cannot run beside "
        "this torch: the torch imported is not the one tsar was built for (the wheel's tsar "
        "refuses to start tsar-torch there); TSAR_PORTABLE=1 does not skip it")
    config.addinivalue_line(
        "markers", "hdf5: a test that packs or exports HDF5, skipped where tsar was built without "
        "it (the wheel: TSAR_SELF_CONTAINED)")


def _tsar_torch_absent():
    """Why tsar-torch cannot run beside the torch this process imported, or ''.
    It links the LibTorch of the torch tsar was built for: beside another torch
    the wheel's tsar refuses to start it (cli/forward.cc). Not _backend's
    why_portable, which TSAR_PORTABLE=1 sets whatever the torch: that chooses
    the Python package's path only, and tsar-torch runs there."""
    import torch

    from tsar import _build_info

    built = _build_info.torch_version
    if not built:
        return "this tsar was built without LibTorch"
    if torch.__version__ != built:
        return f"it is built for torch {built}, and this is torch {torch.__version__}"
    return ""


def pytest_collection_modifyitems(config, items):
    from tsar import _backend, _build_info

    skips = {}
    if _backend.accelerator is None:
        skips["accelerator"] = pytest.mark.skip(
            reason=f"the accelerator's behaviour; this process runs the {_backend.describe()}")
    why = _tsar_torch_absent()
    if why:
        skips["tsar_torch"] = pytest.mark.skip(
            reason=f"needs tsar-torch, the tsar command's LibTorch half, which cannot run here: "
                   f"{why}")
    if not _build_info.hdf5:
        skips["hdf5"] = pytest.mark.skip(reason="this tsar was built without HDF5 (the wheel)")
    for item in items:
        for keyword, skip in skips.items():
            if keyword in item.keywords:
                item.add_marker(skip)
