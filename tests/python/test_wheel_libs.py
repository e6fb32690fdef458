"""scripts/check_wheel_libs.py, the check that a wheel needs no library beyond
itself, glibc, the C++ runtime and torch (issue 43 item 3; check-wheel.sh runs
it on the real wheel): it fails, naming file and library, where one comes from
elsewhere, and passes what it should."""
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts", "check_wheel_libs.py")


pytest.importorskip("elftools", reason="check_wheel_libs.py reads ELF files with pyelftools "
                    "(scripts/requirements.txt)")


def check(wheel, *args):
    r = subprocess.run([sys.executable, CHECK, str(wheel), *args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def needs(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


@pytest.mark.hdf5
def test_a_library_from_a_dev_package_fails_naming_it(cli, tmp_path):
    # The tsar command of this (Debian-linked) build needs libhdf5 and more.
    outside = [n for n in needs(cli) if n.startswith(("libhdf5", "libminizip", "libxxhash"))]
    assert outside, needs(cli)
    wheel = tmp_path / "tsar-0.1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(cli, "tsar-0.1.0.data/scripts/tsar")
        z.writestr("tsar/__init__.py", "")
    rc, out = check(wheel)
    assert rc == 1, out
    for lib in outside:
        assert f"tsar-0.1.0.data/scripts/tsar needs {lib}" in out, out


def test_glibc_the_cxx_runtime_torch_and_the_wheels_own_pass(tmp_path):
    torch = pytest.importorskip("torch")
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    wheel = tmp_path / "w-1-cp311-cp311-manylinux_2_35_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write("/bin/true", "w/true")  # libc only
        z.write(os.path.join(torch_lib, "libtorch.so"), "w/libtorch.so")  # torch's, C++ runtime
    rc, out = check(wheel, "--torch-lib", torch_lib)
    assert rc == 0 and "platform tag manylinux_2_35_x86_64, 2 ELF files" in out, out
    # A torch library that is not in the torch given is from elsewhere.
    rc, out = check(wheel, "--torch-lib", str(tmp_path))
    assert rc == 1 and "w/libtorch.so needs libtorch_cpu.so" in out, out
