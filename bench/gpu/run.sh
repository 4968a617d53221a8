#!/usr/bin/env bash
# The GPU check: builds the reader-only Python module, writes a synthetic
# frames store, checks that stored bytes converted on the GPU equal the CPU
# float32 batches bit for bit, and measures windows/s into CUDA tensors by
# thread count, DataLoader with output="stored" against float32, and the
# pinned host-to-device copy ceiling. About 3 minutes on a 16-core machine
# with one GPU. Needs nothing from the network: python3 with torch, numpy and
# pybind11, cmake and a C++17 compiler; LMDB and xxHash come from the system
# or from Debian packages carried in .gpu/debs (bash bench/gpu/fetch_debs.sh
# on a machine with apt puts them there).
#
# Usage (from the repository root): bash bench/gpu/run.sh [OUT_DIR]
#   OUT_DIR (default $OUT or /tmp/patchstore-gpu) receives gpu.txt, the
#   figures as printed. PATCHSTORE_GPU_FRAMES (default 12) sets the store size;
#   PATCHSTORE_GPU_BUILD (default: a temporary folder) the build folder.
# Without CUDA it stops after the build with exit 0 and says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT_DIR=${1:-${OUT:-/tmp/patchstore-gpu}}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /tmp/patchstore-gpu.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PY=${PYTHON:-python3}
JOBS=$(nproc)
BUILD=${PATCHSTORE_GPU_BUILD:-$WORK/build}

# LMDB and xxHash: unpacked from carried Debian packages when there are some.
CMAKE_EXTRA=()
if ls .gpu/debs/*.deb >/dev/null 2>&1; then
  for f in .gpu/debs/*.deb; do dpkg -x "$f" "$WORK/deps"; done
  DEPS=$WORK/deps/usr
  export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  CMAKE_EXTRA+=("-DCMAKE_PREFIX_PATH=$DEPS")
  export CPATH=$DEPS/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
fi

echo "== reader-only build (cmake -DPATCHSTORE_INGEST=OFF)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPATCHSTORE_INGEST=OFF -DPATCHSTORE_BUILD_TESTS=OFF \
  -DPATCHSTORE_BUILD_BENCH=OFF -DPython_EXECUTABLE="$(command -v "$PY")" \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" "${CMAKE_EXTRA[@]}" >"$WORK/cmake.log" ||
  { cat "$WORK/cmake.log"; exit 1; }
cmake --build "$BUILD" -j"$JOBS" --target _patchstore patchstore_store >"$WORK/build.log" ||
  { tail -50 "$WORK/build.log"; exit 1; }
c++ -O2 -std=c++17 -Iinclude -Itests -DPATCHSTORE_CLI_PATH="\"patchstore\"" bench/gpu/make_store.cc tests/test_util.cc \
  "$BUILD/libpatchstore_store.a" -llmdb -lxxhash -lpthread -o "$WORK/make_store"
export PYTHONPATH=$ROOT/bindings:$BUILD/bindings/python
"$PY" -c "import patchstore, patchstore.torch; print('import patchstore', patchstore.__version__, 'ok')"

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "== no CUDA device: the GPU check stops here (build and import checked)" | tee "$OUT_DIR/gpu.txt"
  exit 0
fi

FRAMES=${PATCHSTORE_GPU_FRAMES:-12}
"$WORK/make_store" "$WORK/compact.ps" "$FRAMES" 1080 1920 float32
"$WORK/make_store" "$WORK/compact-f16.ps" "$FRAMES" 1080 1920 float16
{
  echo "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo GPU), $JOBS cores"
  PYTHONUNBUFFERED=1 "$PY" bench/python_stored_bench.py --device cuda --threads 1 4 8 16 --workers 4 8 \
    --repeats 2 --store "tiles+compact=$WORK/compact.ps" --store "tiles+compact, depth=float16=$WORK/compact-f16.ps"
} 2>&1 | tee "$OUT_DIR/gpu.txt"
