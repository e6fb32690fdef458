#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SAMPLES_DIR CORPUS_DIR SECONDS: runs a libFuzzer target
# for a bounded time, seeded from samples/ (valid and invalid archives).
set -euo pipefail
fuzzer=$1 samples=$2 corpus=$3 seconds=$4
mkdir -p "$corpus"
cp -f "$samples"/valid/*.tsar "$samples"/invalid/*.tsar "$corpus"/
exec "$fuzzer" "$corpus" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
