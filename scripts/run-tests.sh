#!/usr/bin/env bash
# run-tests.sh: set-up (scripts/setup.sh), then every test: the main suite
# (ctest in build/), the build without LibTorch (build-notorch/), the oldest
# supported torch (scripts/test-oldest-torch.sh: build-oldest/ and the portable
# path), tsar inside vLLM's CPU build (scripts/test-vllm.sh: the wheel installed
# into .venv-vllm, tests/python/test_vllm.py there; skipped, saying why, only
# where vLLM cannot be installed), then everything again under ASan + UBSan
# with clang, with the libFuzzer targets run for a bounded time (build-fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys relative to the checkout (paths under it rewritten, the build
# folder not hashed): a clone in another folder (CI's) reuses what a build
# here compiled, instead of a cold build of every LibTorch translation unit.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
# Each stage says how long it took: CI's budget is 45 minutes for all of them.
stage() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "run-tests: $name took $((SECONDS - start)) s (${SECONDS} s in all)"
}
stage set-up scripts/setup.sh build
stage "main suite" ctest --test-dir build --output-on-failure -j "$(nproc)"
stage "without LibTorch" scripts/test-without-torch.sh build-notorch build/cli/tsar
stage "oldest torch and the wheel" scripts/test-oldest-torch.sh
stage "vLLM" scripts/test-vllm.sh

# Sanitizers and fuzzing: everything again with clang, ASan + UBSan and
# libFuzzer coverage (LibTorch-linked tests included), then each fuzzer for
# TSAR_FUZZ_SECONDS (scripts/fuzz.sh runs them for an hour).
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTSAR_WITH_TORCH=ON -DTSAR_SANITIZE=ON -DTSAR_FUZZ=ON -DTSAR_FUZZ_SECONDS="${TSAR_FUZZ_SECONDS:-30}" > /dev/null
stage "sanitizer build" cmake --build build-fuzz -j "$(nproc)"
stage "sanitizer suite and fuzzers" ctest --test-dir build-fuzz --output-on-failure -j "$(nproc)"
echo "run-tests: all tests passed"
