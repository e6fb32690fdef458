#!/usr/bin/env bash
# setup.sh [BUILD_DIR]: installs the Debian 12 packages tsar needs (only those
# missing; needs root), then configures and builds tsar with CMake + Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

packages=(
  g++ cmake ninja-build pkg-config ccache          # toolchain
  libtorch-dev                                      # LibTorch 1.13 (CPU)
  libxxhash-dev libcli11-dev nlohmann-json3-dev libhdf5-dev
  libgtest-dev libbenchmark-dev                     # tests, benchmarks
  clang libclang-rt-14-dev                          # libFuzzer + sanitizers
  python3-torch python3-torchvision python3-h5py python3-numpy   # test fixtures
  util-linux mount                                  # unshare, mount (read-only mount test)
  gnuplot-nox                                       # benchmark charts (bench/run.sh)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j "$(nproc)"
