#!/bin/bash
# Makes the folder scripts/gpu-check.sh builds with on a GPU machine that has
# torch, cmake and ninja but no network and none of Debian's packages:
#   include/     xxhash.h (used inlined), nlohmann/, CLI/ and dlpack/ (header-only)
#   googletest/  GoogleTest's source (Debian's googletest package)
#   wheels/      pytest and pybind11, the peers P8 measures (safetensors,
#                fastsafetensors, the Run:ai streamer, tensorizer), for that
#                machine's Python
# minizip and HDF5 do not travel: that build turns them off (TSAR_WITH_ZIP,
# TSAR_WITH_HDF5), which no GPU test needs. About 50 MB (tensorizer's boto3
# and botocore 17 of them).
#
#   scripts/gpu-deps.sh [DIR] [--python-version 3.12]
# DIR defaults to shared/gpu-deps (what the device tool carries with the tree).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=shared/gpu-deps
pyver=3.12
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) pyver=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-deps.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) dir=$1; shift ;;
  esac
done
for f in /usr/include/xxhash.h /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp /usr/include/dlpack/dlpack.h \
         /usr/src/googletest/CMakeLists.txt; do
  [ -e "$f" ] || { echo "gpu-deps.sh: $f is missing: run scripts/setup.sh first (Debian's libxxhash-dev, nlohmann-json3-dev, libcli11-dev, libdlpack-dev, googletest)" >&2; exit 1; }
done
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/include" "$dir.tmp/wheels"
cp /usr/include/xxhash.h "$dir.tmp/include/"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/dlpack "$dir.tmp/include/"
cp -r /usr/src/googletest "$dir.tmp/googletest"
# Pinned as in scripts/requirements*.txt; wheels only, for the other machine's
# Python (pure-Python and abi3 wheels for the rest).
pins() { grep -hE "^($1)==" scripts/requirements.txt scripts/requirements-peers.txt; }
py=.venv/bin/python; [ -x $py ] || py=python3
$py -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform any -d "$dir.tmp/wheels" $(pins 'pytest|safetensors|pybind11')
# The streaming peers are optional on the other machine: a row is skipped
# where a wheel is missing. The Run:ai streamer's and tensorizer's own
# requirements name torch and numpy: torch is that machine's, numpy comes
# pinned. What tensorizer imports with it: boto3 (and its requirements), redis,
# libnacl, psutil (install with --no-deps: tensorizer boto3 botocore s3transfer
# jmespath python-dateutil six urllib3 redis libnacl psutil).
for p in $(pins 'fastsafetensors|humanize|typer|numpy|boto3|redis|libnacl|psutil') \
         "--no-deps $(pins 'runai-model-streamer')" "--no-deps $(pins 'tensorizer')"; do
  $py -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_30_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform any -d "$dir.tmp/wheels" $p || echo "gpu-deps.sh: no $pyver wheel of $p: its P8 row will be skipped there" >&2
done
rm -rf "$dir" && mv "$dir.tmp" "$dir"
echo "gpu-deps.sh: $dir ($(du -sh "$dir" | cut -f1)): $(ls "$dir/wheels" | wc -l) wheels, headers, GoogleTest source"
