#!/usr/bin/env bash
# test_install.sh BUILD_DIR SOURCE_DIR ARCHIVE: installs tsar from BUILD_DIR into a
# temporary prefix, builds tests/install as a user project with find_package(tsar)
# and with pkg-config, runs both on ARCHIVE, and checks the installed `tsar`.
set -euo pipefail
build=$1 src=$2 archive=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
cmake -S "$src/tests/install" -B "$tmp/app" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" > /dev/null
cmake --build "$tmp/app" > /dev/null
out=$("$tmp/app/app" "$archive")
echo "find_package: $out"
[[ "$out" == *"tensors, first"*"format 1.0" ]]
flags=$(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs tsar)
echo "pkg-config: $flags"
[[ "$flags" == *"-ltsar"* && "$flags" == *"$tmp/prefix"* ]]
"$tmp/prefix/bin/tsar" --version | grep -q "format 1.0"
"$tmp/prefix/bin/tsar" inspect "$archive" > /dev/null
echo "install ok"
