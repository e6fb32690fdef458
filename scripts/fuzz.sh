#!/usr/bin/env bash
# fuzz.sh [SECONDS] [FUZZER...]: the standing fuzz campaign. Builds the
# sanitizer build that CI uses (build-fuzz/: clang, ASan + UBSan, libFuzzer,
# with LibTorch) and runs each fuzzer for SECONDS (default 3600: one hour),
# as many at once as there are cores (or TSAR_FUZZ_JOBS), each on its corpus in
# build-fuzz/corpora/NAME (kept between runs; seeded as in CI). A finding is
# saved as build-fuzz/findings/NAME/crash-* (or leak-, timeout-, oom-) and
# makes the script exit 1; the last lines of each log are printed.
#   Fuzzers: decode (format/ index decoder), pickle (restricted unpickler),
#   load (Archive with LibTorch), import (torch.save zip and safetensors, then
#   pack and read back), export (.pt, .safetensors, .h5, then read back).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-3600}
shift || true
fuzzers=("$@")
[[ ${#fuzzers[@]} -gt 0 ]] || fuzzers=(decode pickle load import export)

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTSAR_WITH_TORCH=ON -DTSAR_SANITIZE=ON -DTSAR_FUZZ=ON > /dev/null
cmake --build build-fuzz -j "$(nproc)"
.venv/bin/python tests/fuzz/make_import_seeds.py build-fuzz/tests/import_seeds

seeds() {
  case $1 in
    decode | load | export) echo samples/valid samples/invalid ;;
    pickle) echo tests/fuzz/pickle_seeds ;;
    import) echo build-fuzz/tests/import_seeds ;;
  esac
}
max_len() { case $1 in import | pickle) echo 65536 ;; *) echo 8192 ;; esac; }

run() {
  local name=$1 dir=build-fuzz/findings/$1
  mkdir -p "$dir"
  # shellcheck disable=SC2046
  if (cd "$dir" && ../../../scripts/run_fuzzer.sh "../../tests/tsar_${name}_fuzzer" \
        "../../corpora/$name" "$seconds" "$(max_len "$name")" \
        $(for s in $(seeds "$name"); do echo "../../../$s"; done)) > "$dir/log" 2>&1; then
    echo "fuzz $name: ${seconds} s, no finding ($(grep -o 'stat::number_of_executed_units: [0-9]*' "$dir/log" | tail -1))"
  else
    echo "fuzz $name: FINDING, see $dir/log and $dir/"; tail -30 "$dir/log"; return 1
  fi
}
export -f run seeds max_len
export seconds
printf '%s\n' "${fuzzers[@]}" | xargs -P "${TSAR_FUZZ_JOBS:-$(nproc)}" -I{} bash -c 'run {}'
