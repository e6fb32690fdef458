#!/usr/bin/env bash
# check-wheel.sh PYTHON SOURCE_DIR [BUILD_DIR]: builds the wheel as it ships
# (scripts/build-wheel.sh: pip wheel, auditwheel repair, its libraries
# checked to be the wheel's, glibc's, the C++ runtime's or torch's only, its
# tag manylinux_2_34 or older), then
# installs it into a fresh
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
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The wheel as it ships (scripts/build-wheel.sh: built, repaired manylinux,
# its libraries checked); BUILD_DIR as build-wheel.sh takes it.
"$src/scripts/build-wheel.sh" "$python" "$src" "$tmp/dist" ${3:+"$3"} | tee "$tmp/build.log"
wheel=$(tail -1 "$tmp/build.log")
# For RHEL 9 and Amazon Linux 2023 (glibc 2.34, GCC 11): a symbol that needs
# newer libraries raises the tag auditwheel gives (cmake/symbol_versions.h).
glibc=$(basename "$wheel" | sed -n 's/.*-manylinux_2_\([0-9]*\)_x86_64\.whl$/\1/p')
[ -n "$glibc" ] && [ "$glibc" -le 34 ] ||
  { echo "FAIL: $(basename "$wheel") is not manylinux_2_34 or older: objdump -T shows which symbol needs more"; exit 1; }

# A fresh venv beside the same torch, the wheel installed.
"$src/scripts/install-wheel-beside.sh" "$python" "$wheel" "$tmp/v"

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
