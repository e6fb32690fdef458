#!/usr/bin/env bash
# run_fuzzer.sh FUZZER CORPUS_DIR SECONDS MAX_LEN SEED_DIR...: runs a libFuzzer
# target for a bounded time on its corpus (kept between runs), first adding
# the seed files (every file of each SEED_DIR; for samples/valid and
# samples/invalid, their .tsar archives).
set -euo pipefail
fuzzer=$1 corpus=$2 seconds=$3 max_len=$4
shift 4
mkdir -p "$corpus"
for dir in "$@"; do
  for f in "$dir"/*; do
    if [[ -f $f && ( $f == *.tsar || $dir != */samples/* ) ]]; then cp -f "$f" "$corpus"/; fi
  done
done
exec "$fuzzer" "$corpus" -max_total_time="$seconds" -max_len="$max_len" -timeout=10 \
  -rss_limit_mb=4096 -print_final_stats=1
