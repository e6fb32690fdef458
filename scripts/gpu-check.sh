#!/bin/bash
# One command for a machine with a GPU (issue 29): builds tsar's loader, its
# Python package and its GPU tests against the CUDA torch already installed
# there, runs every GPU test and the GPU benchmark P8, and prints one table.
# It needs python3 with a CUDA build of torch (2.1 or newer), cmake, ninja, a
# C++ compiler and the CUDA toolkit (nvcc: torch's CMake config asks for it);
# no network and none of Debian's packages: the libraries
# tsar builds with come in a folder made beforehand on a Debian machine by
# scripts/gpu-deps.sh (headers, GoogleTest's source, wheels for pytest and
# the benchmark's peers; minizip and HDF5 are turned off for this build).
#
#   scripts/gpu-deps.sh                 # on the Debian machine: shared/gpu-deps
#   scripts/gpu-check.sh [options]      # on the GPU machine, in a copy of the tree
#
# Options:
#   --deps DIR     the folder from gpu-deps.sh (default shared/gpu-deps of the tree)
#   --python PY    the Python with CUDA torch (default $TSAR_GPU_PYTHON, else
#                  /opt/torch/.venv/bin/python, else python3)
#   --build DIR    build folder (default build-gpu); pytest and the peers that
#                  PY lacks are installed into DIR/pylib (PY's environment stays)
#   --sizes LIST   P8 model sizes in GiB (default 2,8)
#   --cold LIST    of those, the sizes P8 also loads from a cold page cache
#                  (default the first)
#   --out DIR      where the tables go (default $OUT if set, else build-gpu/results)
#   --no-bench     tests only
# Exit status: 0 when every test passed or skipped, 1 when one failed, 2 for
# bad use. Without a GPU it still builds and runs: the GPU cases skip saying
# why, and P8 says it was not measured.
set -euo pipefail
caller=$PWD
repo=$(cd "$(dirname "$0")/.." && pwd)
deps=$repo/shared/gpu-deps
py=${TSAR_GPU_PYTHON:-}
build=$repo/build-gpu
sizes=2,8
cold=
out=${OUT:-}
bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) deps=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --cold) cold=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-bench) bench=0; shift ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$py" ]; then
  if [ -x /opt/torch/.venv/bin/python ]; then py=/opt/torch/.venv/bin/python; else py=python3; fi
fi
# Paths as the caller gave them, relative to where the script was started.
cd "$caller"
case "$py" in */*) py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;; *) py=$(command -v "$py") ;; esac
[ -n "$out" ] || out=$build/results
mkdir -p "$build" "$out"
build=$(cd "$build" && pwd)
out=$(cd "$out" && pwd)
[ -d "$deps" ] && deps=$(cd "$deps" && pwd)
cd "$repo"
[ -f "$deps/include/xxhash.h" ] || {
  echo "gpu-check.sh: $deps holds no include/xxhash.h: make the folder with scripts/gpu-deps.sh on a Debian machine (then carry it here)" >&2
  exit 2
}
"$py" -c "import torch" 2>/dev/null || { echo "gpu-check.sh: $py cannot import torch (--python names another)" >&2; exit 2; }
export PATH="$(dirname "$py"):$PATH"  # a venv's cmake and ninja
for tool in cmake ninja; do
  command -v $tool >/dev/null || { echo "gpu-check.sh: $tool is not on PATH" >&2; exit 2; }
done
# The CUDA torch's own CMake config (find_package(Torch)) needs the CUDA toolkit.
if ! command -v nvcc >/dev/null && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] &&
   "$py" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)"; then
  echo "gpu-check.sh: no nvcc on PATH or in \$CUDA_HOME/bin (default /usr/local/cuda): torch's CMake config needs the CUDA toolkit" >&2
  exit 2
fi
command -v nvcc >/dev/null || export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
step() { echo "== gpu-check: $* ($(date +%T))"; }

step "python and torch"
"$py" - <<'EOF'
import torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (GPU cases will skip)"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: {gpu}")
EOF

step "pytest and the peers into $build/pylib (wheels from $deps/wheels, no network)"
lib=$(mkdir -p "$build/pylib" && cd "$build/pylib" && pwd)
has() { PYTHONPATH=$lib "$py" -c "import $1" 2>/dev/null; }
pipt() { "$py" -m pip install -q --no-index --find-links "$deps/wheels" --target "$lib" --upgrade "$@"; }
has pytest || pipt pytest
has pybind11 || pipt pybind11 || true  # for the Python package's build
has safetensors || pipt safetensors || echo "gpu-check.sh: safetensors does not install here: its P8 row is skipped"
has fastsafetensors || pipt fastsafetensors 2>/dev/null || echo "gpu-check.sh: fastsafetensors does not install here: its P8 row is skipped"
# The Run:ai streamer names torch among its requirements: this machine's torch stays.
has numpy || pipt numpy 2>/dev/null || true
has runai_model_streamer || pipt --no-deps runai-model-streamer humanize 2>/dev/null ||
  echo "gpu-check.sh: runai-model-streamer does not install here: its P8 row is skipped"
# tensorizer names torch among its requirements too: its own needs by name.
has tensorizer || pipt --no-deps tensorizer boto3 botocore s3transfer jmespath python-dateutil six \
  urllib3 redis libnacl psutil 2>/dev/null ||
  echo "gpu-check.sh: tensorizer does not install here: its P8 row is skipped"

step "configure and build (tsar_device_tests, the Python package)"
pybind11_dir=$(PYTHONPATH=$lib "$py" -m pybind11 --cmakedir 2>/dev/null || true)
configure() {
  cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTSAR_PYTHON="$py" \
    ${pybind11_dir:+-Dpybind11_DIR="$pybind11_dir"} \
    -DTSAR_DEPS_DIR="$deps" -DTSAR_WITH_ZIP=OFF -DTSAR_WITH_HDF5=OFF "$@" >"$build/configure.log" 2>&1
}
python_package=1
if ! configure -DTSAR_WITH_PYTHON=ON; then
  # Without Python's headers (or pybind11) the C++ GPU tests still run.
  tail -15 "$build/configure.log"
  echo "gpu-check.sh: the Python package cannot be built here (above); C++ GPU tests only"
  python_package=0
  configure -DTSAR_WITH_PYTHON=OFF || { tail -30 "$build/configure.log"; exit 1; }
fi
targets=tsar_device_tests
[ $python_package = 0 ] || targets="$targets tsar_python"
ninja -C "$build" $targets >"$build/build.log" 2>&1 || { tail -40 "$build/build.log"; exit 1; }
tail -1 "$build/build.log"

step "GPU tests"
failed=0
rm -f "$out/gtest.json" "$out/pytest.xml" "$out/pytest-portable.xml" "$out/p8.md"  # no table from an earlier run
"$build/tests/tsar_device_tests" --gtest_output=json:"$out/gtest.json" >"$out/gtest.log" 2>&1 || failed=1
tail -3 "$out/gtest.log"
if [ $python_package = 1 ]; then
  PYTHONPATH=$build/python:$lib "$py" -m pytest tests/python/test_device.py -q -rs -p no:cacheprovider \
    --junitxml="$out/pytest.xml" >"$out/pytest.log" 2>&1 || failed=1
  tail -5 "$out/pytest.log"
  # The same tests on the portable path (what runs beside another torch): its
  # own staging engine over torch's Python API (tsar/_portable_device.py).
  TSAR_PORTABLE=1 PYTHONPATH=$build/python:$lib "$py" -m pytest tests/python/test_device.py \
    tests/python/test_portable_device.py -q -rs -p no:cacheprovider \
    --junitxml="$out/pytest-portable.xml" >"$out/pytest-portable.log" 2>&1 || failed=1
  tail -3 "$out/pytest-portable.log"
else
  echo "Python GPU tests and P8 not run: no Python package" | tee "$out/pytest.log"
  failed=1
  bench=0
fi

if [ $bench = 1 ]; then
  step "P8 benchmark (sizes $sizes GiB)"
  (cd bench && PYTHONPATH="$build/python:.:$lib" "$py" peers/p8_gpu.py \
     --sizes "$sizes" --cold "${cold:-${sizes%%,*}}" --workdir "$build/p8" --out "$out/p8.md") >"$out/p8.log" 2>&1 ||
    { echo "P8 failed:"; tail -20 "$out/p8.log"; failed=1; }
fi

step "summary"
"$py" - "$out" <<'EOF'
import json, os, sys, xml.etree.ElementTree as ET
out = sys.argv[1]
rows = []
try:
    g = json.load(open(os.path.join(out, "gtest.json")))
    for suite in g["testsuites"]:
        for t in suite["testsuite"]:
            state = "skipped" if t.get("result") == "SKIPPED" else ("failed" if t.get("failures") else "passed")
            rows.append((f"C++ {suite['name']}.{t['name']}", state))
except (OSError, ValueError, KeyError):
    rows.append(("C++ tsar_device_tests", "did not run (see gtest.log)"))
for xml, label in (("pytest.xml", "Python"), ("pytest-portable.xml", "Python (portable path)")):
    try:
        for case in ET.parse(os.path.join(out, xml)).iter("testcase"):
            kids = {c.tag for c in case}
            state = "failed" if kids & {"failure", "error"} else ("skipped" if "skipped" in kids else "passed")
            rows.append((f"{label} {case.get('name')}", state))
    except (OSError, ET.ParseError):
        rows.append((f"{label} tests", f"did not run (see {xml[:-4]}.log)"))
print("| GPU test | result |\n|---|---|")
for name, state in rows:
    print(f"| {name} | {state} |")
p8 = os.path.join(out, "p8.md")
if os.path.exists(p8):
    print()
    print(open(p8).read())
EOF
exit $failed
