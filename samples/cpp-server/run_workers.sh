#!/usr/bin/env bash
# run_workers.sh BUILD_DIR WORKDIR [N]: starts N (default 8) tsar workers that
# bind WORKDIR/resnet18.tsar, then N workers that load weights privately
# (torch::jit::load), and prints load time and summed Pss of each group.
set -euo pipefail
build=$1 work=$2 n=${3:-8}
worker="$build/samples/cpp-server/tsar_worker"

pss_total() {  # summed Pss (kB) of the given pids, from /proc/PID/smaps_rollup
  local sum=0
  for pid in "$@"; do
    sum=$((sum + $(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup")))
  done
  echo "$sum"
}

archive_pss() {  # summed Pss (kB) of the mappings of the archive in the given pids
  local sum=0
  for pid in "$@"; do
    sum=$((sum + $(awk -v f="$work/resnet18.tsar" '/^[0-9a-f]+-[0-9a-f]+ / {inside = ($NF == f)} inside && /^Pss:/ {s += $2} END {print s + 0}' "/proc/$pid/smaps")))
  done
  echo "$sum"
}

run_group() {  # label, worker args...
  local label=$1; shift
  local pids=() fifos=() loads=()
  for i in $(seq 1 "$n"); do
    mkfifo "$work/in.$i"
    "$worker" "$@" < "$work/in.$i" > "$work/out.$i" 2> "$work/err.$i" &
    pids+=($!)
    exec {fd}> "$work/in.$i"
    fifos+=("$fd")
  done
  for i in $(seq 1 "$n"); do
    until grep -q '^ready' "$work/out.$i" 2>/dev/null; do
      kill -0 "${pids[$((i-1))]}" 2>/dev/null || { cat "$work/err.$i" >&2; exit 3; }
      sleep 0.05
    done
    loads+=("$(sed -n 's/^ready load_ms=//p' "$work/out.$i")")
  done
  local pss weights avg bind
  pss=$(pss_total "${pids[@]}")
  weights=$(archive_pss "${pids[@]}")
  avg=$(printf '%s\n' "${loads[@]}" | awk '{s+=$1} END {printf "%.1f", s/NR}')
  bind=$(cat "$work"/err.* | awk '/^bind_ms/ {s+=$2; k++} END {if (k) printf "%.2f ms", s/k; else print "-"}')
  printf '%-30s %2d workers | start %7s ms avg | bind %8s | summed Pss %7.1f MiB, of it archive pages %6.1f MiB\n' \
    "$label" "$n" "$avg" "$bind" "$(awk -v p="$pss" 'BEGIN {print p/1024}')" "$(awk -v p="$weights" 'BEGIN {print p/1024}')"
  # One request to the first worker: both groups must answer the same.
  echo run >&"${fifos[0]}"
  until grep -q '^out' "$work/out.1" 2>/dev/null; do sleep 0.05; done
  printf '%-30s first answer: %s\n' "" "$(grep '^out' "$work/out.1")"
  for fd in "${fifos[@]}"; do exec {fd}>&-; done
  wait "${pids[@]}" 2>/dev/null || true
  rm -f "$work"/in.* "$work"/out.* "$work"/err.*
}

if [ -e "$work/resnet18.aoti.pt2" ]; then  # the archive holds the compiled program (make_model.py)
  echo "model: resnet18, $(du -h "$work/resnet18.tsar" | cut -f1) of weights; start = tsar: open + tsar::load_aoti (AOTInductor, the archive's tensors as constants); baseline: torch::jit::load"
  run_group "tsar (AOTInductor, shared)" --archive "$work/resnet18.tsar" --aoti
else
  echo "model: resnet18, $(du -h "$work/resnet18.tsar" | cut -f1) of weights; start = torch::jit::load (tsar: of the weightless architecture, then open + bind)"
  run_group "tsar (mmap, shared page cache)" --archive "$work/resnet18.tsar" --model "$work/resnet18_arch_ts.pt"
fi
run_group "baseline (torch::jit::load)" --baseline "$work/resnet18_ts.pt" --model "$work/resnet18_ts.pt"
