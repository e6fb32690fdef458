#!/usr/bin/env bash
# setup.sh [BUILD_DIR]: installs the Debian 12 packages tsar needs (only those
# missing; needs root), makes the project's virtual environment .venv with
# torch 2.x and the test tools (pinned in scripts/requirements.txt), then
# configures and builds tsar with CMake + Ninja against that torch's own
# LibTorch. The Python package is importable from BUILD_DIR/python (the tests
# use it there); `pip install .` installs it into an environment (README).
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys relative to the checkout (paths under it rewritten, the build
# folder not hashed): a clone in another folder (CI's) reuses what a build
# here compiled, instead of a cold build of every LibTorch translation unit.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
build=${1:-build}

packages=(
  g++ cmake ninja-build pkg-config ccache          # toolchain
  python3 python3-venv python3-dev                  # .venv and the extension's headers
  libxxhash-dev libcli11-dev nlohmann-json3-dev libhdf5-dev libminizip-dev zlib1g-dev libdlpack-dev
  libgtest-dev libbenchmark-dev                     # tests, benchmarks
  clang libclang-rt-14-dev                          # libFuzzer + sanitizers
  util-linux mount                                  # unshare, mount (read-only mount test)
  gnuplot-nox                                       # benchmark charts (bench/run.sh)
  podman buildah skopeo docker-registry runc        # images, registry, containers (samples/container)
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
if dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "setup: note: Debian's libtorch-dev 1.13 is installed; tsar builds against .venv's torch" \
       "and pins the wheel's c10 (cmake/TsarTorch.cmake)"
fi

# .venv from Debian's python3, made once; reinstalled when requirements.txt changes.
scripts/make-venv.sh .venv

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTSAR_PYTHON="$PWD/.venv/bin/python" > /dev/null
cmake --build "$build" -j "$(nproc)"
