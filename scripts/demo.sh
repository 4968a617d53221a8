#!/usr/bin/env bash
# The main job on an embedded default: generate a small synthetic frames
# dataset in the frames quick start's folder layout, ingest it, read random
# patches from several processes at once, export a few back to images, print
# the figures.
# Usage: bash scripts/demo.sh [OUTDIR]   (default: demo-out)
set -euo pipefail
cd "$(dirname "$0")/.."
# The program and the Python module only: the test suites and benchmarks are
# scripts/test.sh's (it builds them in the same build folder).
PATCHSTORE_CMAKE_ARGS="-DPATCHSTORE_BUILD_GTESTS=OFF -DPATCHSTORE_BUILD_BENCH=OFF ${PATCHSTORE_CMAKE_ARGS:-}" \
  bash scripts/bootstrap.sh
OUT=${1:-demo-out}
PS=build/patchstore
PY=.venv/bin/python
mkdir -p "$OUT"

echo "== 1. generate 2 videos x 6 frames of 1920x1080 (rgb png, mask png, depth exr) in $OUT/frames"
[ -f "$OUT/frames/video01/render/depth/0006.exr" ] || $PY tools/make_frames.py "$OUT/frames" --videos 2 --frames 6

echo "== 2. ingest (decoded once into float32 records)"
rm -rf "$OUT/frames.ps"
$PS ingest images "$OUT/frames.ps" --root "$OUT/frames" \
  --field rgb='{video}/render/rgb/{frame}.png' \
  --field mask='{video}/render/masks/{frame}.png' \
  --field depth='{video}/render/depth/{frame}.exr'
$PS info "$OUT/frames.ps"
$PS verify "$OUT/frames.ps"
du -sh "$OUT/frames" "$OUT/frames.ps"

echo "== 3. random 256x256 windows of rgb+mask+depth from 1, 2 and 4 reader processes"
$PS bench "$OUT/frames.ps" --processes 1,2,4 --seconds 2

if ls build/bindings/python/patchstore/_patchstore*.so >/dev/null 2>&1; then
  echo "== 4. the same store through PyTorch (PatchDataset, mask-aware windows, k=4)"
  PYTHONPATH=bindings:build/bindings/python $PY tools/demo_torch.py "$OUT/frames.ps"
fi

echo "== 5. export two frames back to images for inspection"
rm -rf "$OUT/export"
$PS export "$OUT/frames.ps" "$OUT/export" --id video00/0001 --id video01/0006
find "$OUT/export" -type f | sort
