#!/usr/bin/env bash
# Installs the build tree into a scratch prefix and builds two consumer
# projects against it with find_package(patchstore):
#   reader_consumer  COMPONENTS reader, links patchstore::reader alone, includes
#                    every installed header as "patchstore/<room>/<name>.h";
#                    its link line must name no OpenCV, OpenEXR, HDF5 or ITK library
#   consumer         the full package (patchstore::ingest as well)
# then the installed program and pkg-config file. Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1; SRC=$2
VERSION=$(cat "$SRC/VERSION")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cmake --install "$BUILD" --prefix "$TMP/prefix" >/dev/null
INC=$TMP/prefix/include

# Every installed header sits under include/patchstore/<room>/ and is included
# by the reader consumer; nothing internal is installed.
installed=$(cd "$INC" && find . -type f | sed 's@^\./@@' | sort)
included=$(grep -o '#include "patchstore/[^"]*"' "$SRC/tests/install/reader_consumer/main.cc" | sed 's/#include "//; s/"$//' | sort)
if [ "$installed" != "$included" ]; then
  echo "installed headers differ from the ones reader_consumer includes:"; diff <(echo "$installed") <(echo "$included"); exit 1
fi
# The installed tree is the source include/ tree, file for file and byte for byte,
# and an installed header includes only installed ones ("patchstore/...").
if ! diff -r "$SRC/include" "$INC"; then echo "installed headers differ from the source include/ tree"; exit 1; fi
if grep -rn '#include "' "$INC" | grep -v '#include "patchstore/'; then
  echo "an installed header includes a header that is not installed"; exit 1
fi
# A public header has no namesake among the internals beside the .cc files (an empty store/copy.h
# outlived its move to include/): "store/copy.h" must name one file.
for h in $(cd "$SRC/include/patchstore" && find . -name '*.h' | sed 's@^\./@@'); do
  if [ -e "$SRC/$h" ]; then echo "$SRC/$h shadows the public header include/patchstore/$h"; exit 1; fi
done
for h in patchstore/reader/parallel.h patchstore/ingest/decode.h patchstore/ingest/hdf5_internal.h; do
  if [ -e "$INC/$h" ]; then echo "internal header installed: $h"; exit 1; fi
done
if grep -nE "include.*lmdb|\bMDB_(env|txn|dbi|val|cursor)\b" "$INC/patchstore/store/store.h"; then echo "store.h names an LMDB type"; exit 1; fi

cmake -S "$SRC/tests/install/reader_consumer" -B "$TMP/rbuild" -DCMAKE_PREFIX_PATH="$TMP/prefix" -DCMAKE_BUILD_TYPE=Release -DPATCHSTORE_VERSION="$VERSION" >/dev/null
cmake --build "$TMP/rbuild" -j2 -v > "$TMP/rbuild.log" 2>&1 || { cat "$TMP/rbuild.log"; exit 1; }
link_line=$(grep -- "-o reader_consumer" "$TMP/rbuild.log" || true)
if [ -z "$link_line" ]; then echo "no link line found"; cat "$TMP/rbuild.log"; exit 1; fi
if echo "$link_line" | grep -qi "opencv\|openexr\|imath\|hdf5" || echo "$link_line" | grep -q "libITK"; then
  echo "reader consumer links an image, HDF5 or ITK library: $link_line"; exit 1
fi
"$TMP/rbuild/reader_consumer" "$TMP/rstore"

cmake -S "$SRC/tests/install/consumer" -B "$TMP/build" -DCMAKE_PREFIX_PATH="$TMP/prefix" -DCMAKE_BUILD_TYPE=Release -DPATCHSTORE_VERSION="$VERSION" >/dev/null
cmake --build "$TMP/build" -j2 >/dev/null
"$TMP/build/consumer" "$TMP/store"
test -x "$TMP/prefix/bin/patchstore"
"$TMP/prefix/bin/patchstore" info "$TMP/store" | grep -q "samples:        1"
PKG_CONFIG_PATH="$TMP/prefix/lib/pkgconfig" pkg-config --cflags --libs patchstore | grep -q patchstore_reader
"$TMP/prefix/bin/patchstore" --version | grep -qx "patchstore $VERSION"
test "$(PKG_CONFIG_PATH="$TMP/prefix/lib/pkgconfig" pkg-config --modversion patchstore)" = "$VERSION"
echo "installed package, reader-only and full find_package consumers and pkg-config: ok"
