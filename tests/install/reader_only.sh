#!/usr/bin/env bash
# A reader-only build, as on a GPU training node without the codec libraries:
# configures a second build with the ingest libraries hidden from CMake,
# builds what such a node needs (the store and reader libraries, the Python
# module _patchstore, the `patchstore` program) and checks that
#   - CMake says it is reader-only, and PATCHSTORE_INGEST=ON fails naming the missing libraries;
#   - nothing built links OpenCV, OpenEXR, HDF5, libtiff or ITK (readelf -d, ldd);
#   - its installed CMake package has the reader component alone;
#   - the reader-only program's info, ls, verify give the full program's output on a store the full
#     build wrote, copy converts (--layout tiles --encoding compact), and ingest/montage/export say
#     why they are missing (exit 2);
#   - import patchstore, patchstore.torch work with that _patchstore, read the store's exact values,
#     load no codec library, and patchstore.ingest_images says the build has no ingest.
# Usage: reader_only.sh SOURCE_DIR FULL_BUILD_DIR PYTHON [READER_BUILD_DIR]
#   FULL_BUILD_DIR: a full build (its `patchstore` program and Python modules write the store).
#   READER_BUILD_DIR: default build-reader-only beside FULL_BUILD_DIR (kept: a second run builds
#   only what changed; beside it, ccache serves the full build's objects).
set -euo pipefail
SRC=$(cd "$1" && pwd); FULL=$(cd "$2" && pwd); PY=$3
RO=${4:-$(dirname "$FULL")/build-reader-only}
JOBS=${PATCHSTORE_JOBS:-2}
# The libraries only ingest links; one name per find_package (ITK: optional for ingest).
INGEST_PACKAGES="OpenCV TIFF OpenEXR HDF5 ITK"
HIDE=()
for p in $INGEST_PACKAGES; do HIDE+=("-DCMAKE_DISABLE_FIND_PACKAGE_$p=ON"); done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "reader-only: FAILED: $*"; exit 1; }

echo "== reader-only build in $RO (hidden: $INGEST_PACKAGES)"
# PATCHSTORE_INGEST=ON with the libraries hidden: a configure error that names them.
if cmake -S "$SRC" -B "$TMP/on" -DPATCHSTORE_INGEST=ON "${HIDE[@]}" -DPATCHSTORE_BUILD_TESTS=OFF \
    -DPATCHSTORE_BUILD_BENCH=OFF -DPATCHSTORE_BUILD_PYTHON=OFF > "$TMP/on.log" 2>&1; then
  fail "PATCHSTORE_INGEST=ON configured without the ingest libraries"
fi
# (CMake wraps messages: compared with their lines joined)
joined() { tr -s ' \n' '  ' < "$1"; }
joined "$TMP/on.log" | grep -q "PATCHSTORE_INGEST=ON, but ingest needs libraries that were not found: OpenCV" ||
  { cat "$TMP/on.log"; fail "PATCHSTORE_INGEST=ON: no message naming the missing libraries"; }

# The default (AUTO): reader-only, with a message saying so.
cmake -S "$SRC" -B "$RO" -DCMAKE_BUILD_TYPE=Release "${HIDE[@]}" -DPATCHSTORE_BUILD_BENCH=OFF \
  -DPython_EXECUTABLE="$PY" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" > "$TMP/configure.log" 2>&1 ||
  { cat "$TMP/configure.log"; fail "configure"; }
joined "$TMP/configure.log" | grep -q "patchstore: reader-only build: ingest needs OpenCV" ||
  { cat "$TMP/configure.log"; fail "AUTO without the ingest libraries did not say it builds reader-only"; }
grep -q '^PATCHSTORE_INGEST:STRING=AUTO$' "$RO/CMakeCache.txt" || fail "PATCHSTORE_INGEST is not AUTO by default"
cmake --build "$RO" -j"$JOBS" --target patchstore _patchstore > "$TMP/build.log" 2>&1 ||
  { tail -50 "$TMP/build.log"; fail "build"; }
if cmake --build "$RO" --target help | grep -qE '(patchstore_ingest|_ingest)$'; then
  fail "the reader-only build has an ingest target"
fi

# Nothing links a codec library, and every library it needs is found.
MOD=$(ls "$RO"/bindings/python/patchstore/_patchstore*.so)
for f in "$RO/patchstore" "$MOD"; do
  needed=$(readelf -d "$f" | grep NEEDED || true)
  if echo "$needed" | grep -iE 'opencv|openexr|imath|iex|hdf5|tiff|itk'; then fail "$f links a codec library"; fi
  if ldd "$f" | grep -q "not found"; then ldd "$f"; fail "$f: a library is not found"; fi
done
echo "reader-only: no OpenCV, OpenEXR, HDF5, libtiff or ITK linked: ok"

# The installed package: the reader component alone, and no ingest header.
cmake --install "$RO" --prefix "$TMP/prefix" > /dev/null
[ ! -e "$TMP/prefix/include/patchstore/ingest" ] || fail "ingest headers installed by a reader-only build"
[ -e "$TMP/prefix/include/patchstore/reader/reader.h" ] || fail "reader headers not installed"
mkdir "$TMP/consumer"
cat > "$TMP/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.24)
project(reader_only_consumer LANGUAGES CXX)
find_package(patchstore REQUIRED)
if(NOT TARGET patchstore::reader OR TARGET patchstore::ingest)
  message(FATAL_ERROR "find_package(patchstore) of a reader-only install: reader missing or ingest present")
endif()
find_package(patchstore COMPONENTS ingest)
if(patchstore_FOUND)
  message(FATAL_ERROR "find_package(patchstore COMPONENTS ingest) found ingest in a reader-only install")
endif()
CMAKE
cmake -S "$TMP/consumer" -B "$TMP/consumer/build" -DCMAKE_PREFIX_PATH="$TMP/prefix" > "$TMP/consumer.log" 2>&1 ||
  { cat "$TMP/consumer.log"; fail "find_package(patchstore) of the reader-only install"; }
joined "$TMP/consumer.log" | grep -q "this patchstore was built without ingest" ||
  { cat "$TMP/consumer.log"; fail "COMPONENTS ingest: no message saying the build has no ingest"; }
echo "reader-only: installed package (reader component only): ok"

echo "== reader-only: the program and the Python package on a store the full build wrote"
cd "$TMP"
mkdir data
"$PY" - <<'PY'
import numpy as np
from PIL import Image
for i in range(3):
    a = ((np.arange(20 * 24).reshape(20, 24) * (i + 3)) % 251).astype(np.uint8)
    Image.fromarray(a, "L").save(f"data/{i}.png")
open("data/manifest.csv", "w").write("id,x\n" + "".join(f"s/{i},{i}.png\n" for i in range(3)))
PY
"$FULL/patchstore" -q ingest images frames.ps --manifest data/manifest.csv > /dev/null
for cmd in "info frames.ps" "info frames.ps --json" "ls frames.ps --json" "verify frames.ps"; do
  # shellcheck disable=SC2086
  "$FULL/patchstore" $cmd > full.out 2>&1
  # shellcheck disable=SC2086
  "$RO/patchstore" $cmd > ro.out 2>&1 || { cat ro.out; fail "patchstore $cmd"; }
  diff full.out ro.out > /dev/null || { diff full.out ro.out; fail "patchstore $cmd differs from the full program"; }
done
"$RO/patchstore" -q copy frames.ps tiles.ps --layout tiles --tile-size 8 --encoding compact > copy.out 2>&1 ||
  { cat copy.out; fail "copy --layout tiles --encoding compact"; }
"$RO/patchstore" verify tiles.ps > /dev/null || fail "verify of the converted copy"
for cmd in "ingest images x.ps --manifest m.csv" "montage frames.ps sheet.png" "export frames.ps out"; do
  rc=0
  # shellcheck disable=SC2086
  "$RO/patchstore" $cmd > missing.out 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat missing.out; fail "patchstore $cmd: exit $rc, expected 2"; }
  grep -q "is not in this program: it was built without ingest" missing.out ||
    { cat missing.out; fail "patchstore $cmd: no message saying why"; }
done
"$RO/patchstore" --help > help.out
grep -q "Not in this reader-only build" help.out || { cat help.out; fail "--help does not say what is missing"; }

PYTHONPATH="$SRC/bindings:$RO/bindings/python" "$PY" - <<'PY' || fail "Python package"
import re

import numpy as np

import patchstore
import patchstore.torch  # noqa: F401  (torch itself: from the environment)

try:
    from patchstore import _ingest  # noqa: F401
    raise SystemExit("patchstore._ingest is importable in the reader-only build")
except ImportError:
    pass
expect = {f"s/{i}": ((np.arange(20 * 24).reshape(20, 24) * (i + 3)) % 251).astype(np.float32) / 255 * 2 - 1
          for i in range(3)}
for path in ("frames.ps", "tiles.ps"):
    s = patchstore.open(path)
    assert list(s.ids) == sorted(expect), list(s.ids)
    for i, a in expect.items():
        got = s.patch(i, "x", 3, 5, 10, 12)
        assert got.shape == (1, 10, 12) and np.array_equal(got[0], a.astype(np.float32)[3:13, 5:17]), (path, i)
for call in (lambda: patchstore.ingest_images("x.ps", manifest="m.csv"),
             lambda: patchstore.copy("frames.ps", "c.ps"),
             lambda: patchstore.export("frames.ps", "out")):
    try:
        call()
        raise SystemExit("an ingest function ran in the reader-only build")
    except ImportError as e:
        assert "this build of patchstore has no ingest (built with PATCHSTORE_INGEST=OFF" in str(e), e
loaded = re.findall(r"/lib(opencv|openexr|imath|hdf5|tiff|itk)[^/\n]*$", open("/proc/self/maps").read(), re.I | re.M)
assert not loaded, f"codec libraries loaded: {sorted(set(loaded))}"
print("reader-only Python package: import patchstore, patchstore.torch, exact reads, no codec loaded: ok")
PY
echo "reader-only build: ok"
