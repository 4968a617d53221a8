#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, builds tests/consumer against
# it with find_package(patchstore), runs it. Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1; SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cmake --install "$BUILD" --prefix "$TMP/prefix" >/dev/null
cmake -S "$SRC/tests/install/consumer" -B "$TMP/build" -DCMAKE_PREFIX_PATH="$TMP/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$TMP/build" -j2 >/dev/null
"$TMP/build/consumer" "$TMP/store"
test -x "$TMP/prefix/bin/patchstore"
"$TMP/prefix/bin/patchstore" info "$TMP/store" | grep -q "samples:        1"
PKG_CONFIG_PATH="$TMP/prefix/lib/pkgconfig" pkg-config --cflags --libs patchstore | grep -q patchstore_reader
echo "installed package, find_package consumer and pkg-config: ok"
