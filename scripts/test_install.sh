#!/usr/bin/env bash
# test_install.sh BUILD_DIR SOURCE_DIR ARCHIVE: installs tsar from BUILD_DIR into a
# temporary prefix, builds tests/install as a user project with find_package(tsar)
# and with pkg-config (compiled and run with its flags alone), runs both on
# ARCHIVE, and checks the installed `tsar`.
set -euo pipefail
build=$1 src=$2 archive=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
# LibTorch: the torch wheel's of the build (TsarTorch.cmake), c10 pinned to it.
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")
c10=$(sed -n 's/^c10_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")
cmake -S "$src/tests/install" -B "$tmp/app" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DTorch_DIR="$torch_dir" ${c10:+-Dc10_LIBRARY="$c10"} > /dev/null
cmake --build "$tmp/app" > /dev/null
out=$("$tmp/app/app" "$archive")
echo "find_package: $out"
[[ "$out" == *"tensors, first"*"format 1.0" ]]
flags=$(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs tsar)
echo "pkg-config: $flags"
[[ "$flags" == *"-ltsar"* && "$flags" == *"$tmp/prefix"* ]]
# A user's compile with nothing but pkg-config's flags, run without
# LD_LIBRARY_PATH.
cxx=(g++)
command -v ccache > /dev/null && cxx=(ccache g++)
# shellcheck disable=SC2086
"${cxx[@]}" -std=c++17 "$src/tests/install/app.cc" -o "$tmp/app_pc" $flags
out=$(env -u LD_LIBRARY_PATH "$tmp/app_pc" "$archive")
echo "pkg-config app: $out"
[[ "$out" == *"tensors, first"*"format 1.0" ]]
minor=$(sed -n 's/^#define TSAR_FORMAT_MINOR //p' "$src/include/tsar/version.h")
"$tmp/prefix/bin/tsar" --version | grep -q "format 1.$minor)"
"$tmp/prefix/bin/tsar" inspect "$archive" > /dev/null
# export runs in libexec/tsar/tsar-torch, which the installed tsar must find.
"$tmp/prefix/bin/tsar" export -q "$archive" -o "$tmp/back.safetensors"
[[ -s "$tmp/back.safetensors" ]]
# The LibTorch side of the installed command (libexec/tsar/tsar-torch) finds
# LibTorch by its run path, as the installed library does: export to .pt and
# a TorchScript pack, run without LD_LIBRARY_PATH.
env -u LD_LIBRARY_PATH "$tmp/prefix/bin/tsar" export -q "$archive" -o "$tmp/back.pt"
[[ -s "$tmp/back.pt" ]]
python=$(sed -n 's/^TSAR_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
"$python" -c "import sys, torch; torch.jit.script(torch.nn.Linear(3, 2)).save(sys.argv[1])" "$tmp/ts.pt"
env -u LD_LIBRARY_PATH "$tmp/prefix/bin/tsar" pack -q "$tmp/ts.pt" -o "$tmp/ts.tsar"
"$tmp/prefix/bin/tsar" inspect "$tmp/ts.tsar" | grep -q "weight"
echo "installed tsar: export -o .pt and a TorchScript pack ok"
torch_lib=$("$python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
readelf -d "$tmp/prefix/libexec/tsar/tsar-torch" | grep -q "$torch_lib" ||
  { echo "tsar-torch's run path lacks LibTorch's folder $torch_lib"; exit 1; }
echo "install ok"
