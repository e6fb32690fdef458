#!/usr/bin/env bash
# test-oldest-torch.sh: tsar against the oldest torch it supports
# (scripts/requirements-oldest.txt, in .venv-oldest, made once and kept like
# .venv). Two checks:
#  1. the C++ side and the accelerator built against that torch's LibTorch
#     (build-oldest/) and the main suite run there: the C++ tests and the
#     Python tests (python.pytest);
#  2. the package built in build/ for .venv's torch, imported beside the
#     oldest torch: the same binary runs the portable path
#     (tests/python/test_portable.py).
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
PYTHONPATH="$PWD/build/python" TSAR_CLI="$PWD/build/cli/tsar" \
  .venv-oldest/bin/python -m pytest -q -p no:cacheprovider tests/python/test_portable.py
echo "oldest torch: all tests passed in $(( $(date +%s) - start )) s"
