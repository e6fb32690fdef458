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


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "accelerator: a test of what only tsar's LibTorch-linked parts do (the "
        "accelerator tsar._tsar; tsar-torch behind the tsar command: TorchScript, --arch, export "
        "to .pt), skipped where this process runs the portable path (tsar.backend()): beside "
        "another torch, whose tsar-torch the wheel's tsar refuses to start, or with "
        "TSAR_PORTABLE=1")
    config.addinivalue_line(
        "markers", "hdf5: a test that packs or exports HDF5, skipped where tsar was built without "
        "it (the wheel: TSAR_SELF_CONTAINED)")


def pytest_collection_modifyitems(config, items):
    from tsar import _backend, _build_info

    skips = {}
    if _backend.accelerator is None:
        skips["accelerator"] = pytest.mark.skip(
            reason=f"the accelerator's behaviour; this process runs the {_backend.describe()}")
    if not _build_info.hdf5:
        skips["hdf5"] = pytest.mark.skip(reason="this tsar was built without HDF5 (the wheel)")
    for item in items:
        for keyword, skip in skips.items():
            if keyword in item.keywords:
                item.add_marker(skip)
