#!/usr/bin/env bash
# check-wheel.sh PYTHON SOURCE_DIR [BUILD_DIR]: `pip wheel SOURCE_DIR` with PYTHON's pip
# (build isolation on, as a user runs it), repairs it with auditwheel (a
# manylinux wheel, checked by check_wheel_libs.py to need no library beyond the
# wheel, glibc, the C++ runtime and torch), then installs it into a fresh
# virtual environment that has the same torch (PYTHON's site-packages linked in,
# not reinstalled) and checks there: tsar.__version__, a save and a zero-copy
# load, tsar.pack, no -dev package's library loaded, HDF5 refused with how to
# get it, the `tsar` command on PATH with a TorchScript pack (which runs
# libexec/tsar/tsar-torch: its run path must reach the torch wheel), and that
# beside another torch version tsar runs its portable path (tsar.backend()) and binds.
set -euo pipefail
python=$(command -v "${1:?usage: check-wheel.sh PYTHON SOURCE_DIR}")
python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python")
src=$(cd "${2:?usage: check-wheel.sh PYTHON SOURCE_DIR}" && pwd)
# BUILD_DIR: scikit-build-core's build folder, kept between runs (ctest gives
# one inside the CMake build tree, so reruns and CI's clones reuse ccache's
# objects: the same paths relative to the checkout). Without it pip builds in
# a temporary folder, as for a user: nothing is written into SOURCE_DIR.
wheel_build=()
if [ -n "${3:-}" ]; then
  mkdir -p "$3"
  wheel_build=(--config-settings="build-dir=$(cd "$3" && pwd)/{wheel_tag}")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
"$python" -m pip wheel -q --no-deps "${wheel_build[@]}" -w "$tmp/dist" "$src"
wheel=$(ls "$tmp"/dist/tsar-*.whl)
echo "wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) in $(( $(date +%s) - start )) s"

# A wheel for any Linux: auditwheel grafts nothing into it (what tsar needs
# beyond glibc, libstdc++ and torch is inside its own files: pyproject.toml's
# TSAR_SELF_CONTAINED) and tags it with the oldest manylinux its glibc and
# libstdc++ symbols allow; torch's libraries are the torch wheel's, never
# copied. check_wheel_libs.py checks that every library each ELF file needs
# is the wheel's, glibc's, the C++ runtime's or torch's.
bin=$(dirname "$python")
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
PATH="$bin:$PATH" "$bin/auditwheel" repair --exclude 'libtorch*.so' --exclude 'libc10*.so' \
  -w "$tmp/repaired" "$wheel" > "$tmp/auditwheel.log" 2>&1 || { cat "$tmp/auditwheel.log"; exit 1; }
wheel=$(ls "$tmp"/repaired/tsar-*.whl)
"$python" "$src/scripts/check_wheel_libs.py" "$wheel" --torch-lib "$torch_lib"

# A fresh venv beside the same torch: the packages of PYTHON's environment are
# linked into it, so torch lies at <venv>/lib/pythonX.Y/site-packages/torch.
/usr/bin/python3 -m venv "$tmp/v"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
fresh_site=$("$tmp/v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for entry in "$site"/*; do
  name=$(basename "$entry")
  case $name in pip|pip-*|tsar|tsar-*|_distutils_hack|distutils-precedence.pth|setuptools|setuptools-*) continue ;; esac
  [ -e "$fresh_site/$name" ] || ln -s "$entry" "$fresh_site/$name"
done
"$tmp/v/bin/python" -m pip install -q --no-deps --no-index "$wheel"

cd "$tmp"
want=$(sed -n 's/^project(tsar VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
got=$("$tmp/v/bin/python" -c 'import tsar; print(tsar.__version__)')
[ "$got" = "$want" ] || { echo "FAIL: tsar.__version__ is $got, CMakeLists.txt says $want"; exit 1; }

"$tmp/v/bin/python" - <<'PY'
import torch, tsar
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
tsar.save(m, "m.tsar")
with torch.device("meta"):
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
tsar.load_into(fresh, "m.tsar")
x = torch.randn(3, 8)
assert torch.equal(fresh(x), m(x))
torch.jit.save(torch.jit.script(m), "m_ts.pt")
torch.save(m.state_dict(), "m_sd.pt")
summary = tsar.pack("m_sd.pt", "m_packed.tsar")
assert summary.tensors == 4, summary
with tsar.open("m_packed.tsar") as a:
    assert all(torch.equal(a[k], v) for k, v in m.state_dict().items())
# Nothing of the -dev packages tsar is built with is loaded: xxHash inlined,
# minizip and zlib inside tsar's files, no HDF5 (which says where it is read).
maps = open("/proc/self/maps").read()
for lib in ("libhdf5", "libminizip", "libxxhash"):
    assert lib not in maps, f"the wheel loaded {lib}"
import h5py
with h5py.File("m.h5", "w") as f:
    f["w"] = m[0].weight.detach().numpy()
try:
    tsar.pack("m.h5", "m_h5.tsar")
    raise AssertionError("the wheel packed HDF5")
except tsar.Error as e:
    assert e.code == tsar.ErrorCode.UNSUPPORTED and "libhdf5-dev" in str(e), e
print("wheel: import tsar, save, load_into (meta), pack ok")
PY

tsar_cmd=$(PATH="$tmp/v/bin:$PATH" command -v tsar)
[ "$tsar_cmd" = "$tmp/v/bin/tsar" ] || { echo "FAIL: tsar on PATH is $tsar_cmd"; exit 1; }
"$tmp/v/bin/tsar" --version
"$tmp/v/bin/tsar" pack -q m_ts.pt -o ts.tsar   # TorchScript: runs in tsar-torch
"$tmp/v/bin/tsar" diff m.tsar ts.tsar > /dev/null || { echo "FAIL: TorchScript pack differs"; exit 1; }
if ldd "$tmp/v/bin/tsar" | grep -E 'libtorch|libc10'; then echo "FAIL: the tsar command links LibTorch"; exit 1; fi

# Another torch than the one it was built against: the portable path, which
# reads and binds (m.tsar, saved above) and says it is the one running.
info=$("$tmp/v/bin/python" -c 'import importlib.util as u; print(u.find_spec("tsar").submodule_search_locations[0])')/_build_info.py
sed -i 's/^torch_version = .*/torch_version = "1.0.0+other"/' "$info"
"$tmp/v/bin/python" - <<'EOF' || { echo "FAIL: the portable path beside another torch"; exit 1; }
import torch, tsar
assert tsar.backend().startswith("portable (torch "), tsar.backend()
assert "its accelerator was built for torch 1.0.0+other" in tsar.backend(), tsar.backend()
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
with torch.device("meta"):
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
tsar.load_into(fresh, "m.tsar")
x = torch.randn(3, 8)
assert torch.equal(fresh(x), m(x))
tsar.save(m, "portable.tsar")  # the portable writer: the same bytes
assert open("portable.tsar", "rb").read() == open("m.tsar", "rb").read()
print("wheel: beside another torch,", tsar.backend())
EOF
echo "check-wheel: ok"
