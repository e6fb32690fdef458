#!/usr/bin/env bash
# setup.sh [BUILD_DIR]: installs the Debian 12 packages tsar needs (only those
# missing; needs root), configures and builds tsar with CMake + Ninja, then
# installs the Python package for Debian's /usr/bin/python3 (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

packages=(
  g++ cmake ninja-build pkg-config ccache          # toolchain
  libtorch-dev                                      # LibTorch 1.13 (CPU)
  libxxhash-dev libcli11-dev nlohmann-json3-dev libhdf5-dev libminizip-dev
  libgtest-dev libbenchmark-dev                     # tests, benchmarks
  clang libclang-rt-14-dev                          # libFuzzer + sanitizers
  python3-torch python3-torchvision python3-h5py python3-numpy   # test fixtures
  pybind11-dev python3-dev python3-pytest           # the Python package and its tests
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

# `import tsar` for /usr/bin/python3: the package goes where Debian's own
# Python packages are (/usr/lib/python3/dist-packages/tsar); remove it with
# rm -r. Elsewhere: cmake --install BUILD --component python --prefix PREFIX.
python_prefix=${TSAR_PYTHON_PREFIX:-/usr}
if [ -w "$python_prefix/lib/python3/dist-packages" ] || [ "$(id -u)" -eq 0 ]; then
  cmake --install "$build" --component python --prefix "$python_prefix" > /dev/null
else
  sudo cmake --install "$build" --component python --prefix "$python_prefix" > /dev/null
fi
