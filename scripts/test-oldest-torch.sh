#!/usr/bin/env bash
# test-oldest-torch.sh: tsar against the oldest torch it supports
# (scripts/requirements-oldest.txt, in .venv-oldest, made once and kept like
# .venv), and the wheel at both ends of the range. Three checks:
#  1. the C++ side and the accelerator built against that torch's LibTorch
#     (build-oldest/) and the main suite run there: the C++ tests and the
#     Python tests (python.pytest);
#  2. the wheel as it ships, built for .venv's torch (scripts/build-wheel.sh),
#     installed with --no-deps into a venv beside the oldest torch: the same
#     .whl runs the portable path there and passes the whole Python suite
#     with its own tsar command (tests of tsar-torch and of HDF5, which the
#     wheel leaves out, skip: @pytest.mark.tsar_torch, @pytest.mark.hdf5);
#     its tsar refuses to start tsar-torch, built for
#     .venv's torch, beside this one (it would crash) and says why;
#  3. the same .whl installed beside .venv's torch, the newest supported,
#     where its accelerator runs: the whole Python suite again (issue 43:
#     one wheel, both ends of the range). The suites of 2 and 3 run side by
#     side, one core each, each into its own log.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
scripts/make-venv.sh .venv-oldest scripts/requirements-oldest.txt
start=$(date +%s)
cmake -S . -B build-oldest -G Ninja -Wno-dev -DCMAKE_BUILD_TYPE=Release \
  -DTSAR_PYTHON="$PWD/.venv-oldest/bin/python" > /dev/null
cmake --build build-oldest -j "$(nproc)"
echo "oldest torch: built in $(( $(date +%s) - start )) s against" \
  "$(.venv-oldest/bin/python -c 'import torch; print(torch.__version__)')"
# The wheel, the benchmarks' smoke runs and the containers are checked once,
# in build/: they test packaging and peers, not the torch API.
ctest --test-dir build-oldest --output-on-failure -j "$(nproc)" \
  -E '^(python\.wheel|samples\.container_run|bench\..*)$'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scripts/build-wheel.sh .venv/bin/python . "$tmp/dist" build/wheel-build | tee "$tmp/build.log"
wheel=$(tail -1 "$tmp/build.log")
scripts/install-wheel-beside.sh "$PWD/.venv-oldest/bin/python" "$wheel" "$tmp/v"
"$tmp/v/bin/python" -c 'import sys, torch; torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), sys.argv[1])' \
  "$tmp/ts.pt" 2> /dev/null
if "$tmp/v/bin/tsar" pack -q "$tmp/ts.pt" -o "$tmp/ts.tsar" 2> "$tmp/err"; then
  echo "FAIL: the wheel's tsar packed TorchScript beside another torch"; exit 1
fi
grep -q "built for torch .*, and this environment has torch 2.7" "$tmp/err" ||
  { echo "FAIL: the wheel's tsar beside another torch said:"; cat "$tmp/err"; exit 1; }
echo "oldest torch: the wheel's tsar refuses tsar-torch beside it: $(cut -c1-100 "$tmp/err")..."
oldest=$(.venv-oldest/bin/python -c 'import torch; print(torch.__version__)')
newest=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
scripts/install-wheel-beside.sh "$PWD/.venv/bin/python" "$wheel" "$tmp/n"
"$tmp/n/bin/python" -c 'import tsar; b = tsar.backend(); print("newest torch: the wheel runs", b)
assert b.startswith("accelerator"), "the wheel beside the torch it was built for: " + b'
# The whole Python suite in both venvs, side by side (each pytest is one
# process: two cores, two suites), each into its own log, shown when both end.
suite() {  # VENV LOG
  TSAR_CLI="$1/bin/tsar" TSAR_SAMPLES="$PWD/samples" "$1/bin/python" -m pytest -q \
    -p no:cacheprovider tests/python > "$2" 2>&1
}
suite "$tmp/v" "$tmp/oldest.log" & oldest_pid=$!
suite "$tmp/n" "$tmp/newest.log" & newest_pid=$!
failed=0
for which in oldest newest; do
  pid_var=${which}_pid
  if wait "${!pid_var}"; then
    echo "the wheel beside torch ${!which}: $(tail -1 "$tmp/$which.log")"
  else
    echo "FAIL: the wheel's Python suite beside torch ${!which}:"; cat "$tmp/$which.log"; failed=1
  fi
done
[[ $failed == 0 ]] || exit 1
echo "oldest torch: all tests passed in $(( $(date +%s) - start )) s, the same wheel beside" \
  "torch $oldest and $newest"
