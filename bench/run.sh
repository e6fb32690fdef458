#!/usr/bin/env bash
# bench/run.sh [--build DIR] [--quick] [--only P1,P2,...,PEERS] [--keep-data DIR]
#
# Runs every benchmark of bench/README.md and writes bench/results/
# (report.md, results.csv, samples.csv, p1/p3/p4 PNG charts; peers/peers.md
# with the real peers of issue 28 and their charts). It builds what
# it needs: tsar and tsar_bench via bench/standalone (Release) in DIR
# (default: build-bench/), or reuses DIR if it is already configured. The
# inputs (about 2.5 GB: a 512 MiB model in three formats, resnet18, 100,000
# tensors) go to a temporary directory under $TMPDIR (default /var/tmp; it must
# be a disk, not tmpfs, for the cold-load benchmark) and are removed at exit.
# Needs: the project's .venv (scripts/setup.sh; or TSAR_PYTHON) with torch and torchvision, gnuplot, cmake, ninja.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build="$repo/build-bench"
args=()
keep=""
only=""
quick=()
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --quick) args+=(--quick); quick=(--quick); shift ;;
    --only) args+=(--only "$2"); only=$2; shift 2 ;;
    --keep-data) keep=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
python=${TSAR_PYTHON:-$PWD/.venv/bin/python}
command -v gnuplot > /dev/null || echo "run.sh: gnuplot not found: the report will have no charts (apt-get install gnuplot-nox)" >&2
"$python" -c "import torch, torchvision" 2> /dev/null || { echo "run.sh: $python needs torch and torchvision" >&2; exit 1; }

load=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${load%% *}" 'BEGIN {exit !(l >= 1.0)}'; then
  echo "run.sh: warning: load average is $load; timings will be noisy (the report records it)" >&2
fi

start=$(date +%s)
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  cmake -S "$here/standalone" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build "$build" --target tsar_bench tsar_python -j "${JOBS:-$(nproc)}"
bin=$(find "$build" -name tsar_bench -type f -perm -u+x | head -n1)
[ -n "$bin" ] || { echo "run.sh: tsar_bench not found under $build" >&2; exit 1; }

if [ -n "$keep" ]; then
  data=$keep
  mkdir -p "$data"
else
  data=$(mktemp -d "${TMPDIR:-/var/tmp}/tsar-bench.XXXXXX")
  trap 'rm -rf "$data"' EXIT
fi
fs=$(df -PT "$data" | awk 'NR == 2 {print $2}')
dev=$(df -P "$data" | awk 'NR == 2 {print $1}')
ra=$(cat "/sys/class/block/$(basename "$dev")/queue/read_ahead_kb" 2> /dev/null || echo '?')
[ "$fs" != tmpfs ] || echo "run.sh: warning: $data is on tmpfs; P4 (cold load) will not touch a disk" >&2
[ -f "$data/stack_sd.pt" ] || "$python" "$here/make_data.py" "$data"

results="$here/results"
mkdir -p "$results"
"$bin" run --data "$data" --samples "$results/samples.csv" "${args[@]}"
# P8, P9: the Python package, from the same build.
if [ -z "$only" ] || [[ ",$only," == *,P8,* ]] || [[ ",$only," == *,P9,* ]]; then
  PYTHONPATH="$build/python" "$python" "$here/p8_python.py" --data "$data" \
    --samples "$results/samples.csv" "${quick[@]}"
fi
# P12: every command against 10k-100k tensors (its own table, results/p12_scale.md).
if [ -z "$only" ] || [[ ",$only," == *,P12,* ]]; then
  "$python" "$here/p12_scale.py" --cli "$build/cli/tsar" --data "$data" --out "$results/p12_scale.md" \
    --samples "$results/samples.csv"
fi
# Peers (issue 28): tsar beside torch.load(mmap), safetensors, TensorDict,
# from_pretrained, fastsafetensors and the Run:ai streamer on the same files
# (results/peers/peers.md). The streaming peers are pinned in
# scripts/requirements-peers.txt; the set-up installs them, this makes sure.
if [ -z "$only" ] || [[ ",$only," == *,PEERS,* ]]; then
  "$python" -m pip install -q -r "$repo/scripts/requirements-peers.txt"
  size=bench
  [ ${#quick[@]} -eq 0 ] || size=small
  PYTHONPATH="$build/python" "$python" "$here/peers/run.py" --out "$results/peers" --size "$size" \
    --cli "$build/cli/tsar" --workdir "$data/peers"
  rm -rf "${data:?}/peers"
fi
commit=$(git -C "$repo" rev-parse --short HEAD 2> /dev/null || true)
# Uncommitted changes to the measured code make the commit id insufficient.
if [ -n "$commit" ] && ! git -C "$repo" diff --quiet HEAD -- CMakeLists.txt format writer loader include cli python 2> /dev/null; then
  commit="$commit, with uncommitted changes"
fi
"$python" "$here/report.py" --samples "$results/samples.csv" --out "$results" \
  --command "bench/run.sh${args[*]:+ ${args[*]}}" --commit "$commit" \
  --load "$load" --data-fs "$fs on $dev, read_ahead_kb $ra"
echo "run.sh: done in $(($(date +%s) - start)) s"
