#!/usr/bin/env python3
"""Generate a synthetic frames dataset in the frames quick start's folder layout.

    OUT/<video>/render/rgb/<frame>.png     8-bit RGB
    OUT/<video>/render/masks/<frame>.png   8-bit gray, 0 or 255, a few blobs
    OUT/<video>/render/depth/<frame>.exr   float32 channel Z (or half)

Deterministic for a given --seed. Used by the demo, the tests and benchmarks.
"""
import argparse
import os
import sys

import numpy as np


def write_exr(path, depth, half=False):
    import OpenEXR
    ch = depth.astype(np.float16 if half else np.float32)
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    with OpenEXR.File(header, {"Z": ch}) as f:
        f.write(path)


def make_frame(rng, h, w, valid_fraction):
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.empty((h, w, 3), np.uint8)
    phase = rng.uniform(0, 6.28, size=3)
    for c in range(3):
        rgb[..., c] = (127.5 + 127.5 * np.sin(xx / (17 + 5 * c) + yy / (23 + 3 * c) + phase[c])).astype(np.uint8)
    rgb ^= rng.integers(0, 16, size=(h, w, 3), dtype=np.uint8)
    mask = np.zeros((h, w), np.uint8)
    # Blobs covering roughly valid_fraction of the frame.
    target = valid_fraction * h * w
    while mask.sum() / 255 < target:
        cy, cx = rng.integers(0, h), rng.integers(0, w)
        r = max(2, int(np.sqrt(target / np.pi) / 2 * rng.uniform(0.5, 1.5)))
        y0, y1, x0, x1 = max(0, cy - r), min(h, cy + r), max(0, cx - r), min(w, cx + r)
        mask[y0:y1, x0:x1] = 255
    depth = (1.0 + yy / h + 0.25 * np.cos(xx / 31.0)).astype(np.float32)
    return rgb, mask, depth


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output folder")
    ap.add_argument("--videos", type=int, default=2)
    ap.add_argument("--frames", type=int, default=4, help="frames per video")
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--valid-fraction", type=float, default=0.05, help="share of mask pixels that are non-zero")
    ap.add_argument("--half", action="store_true", help="write depth as half floats")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from PIL import Image

    rng = np.random.default_rng(args.seed)
    n = 0
    for v in range(args.videos):
        video = f"video{v:02d}"
        for sub in ("rgb", "masks", "depth"):
            os.makedirs(os.path.join(args.out, video, "render", sub), exist_ok=True)
        for f in range(args.frames):
            rgb, mask, depth = make_frame(rng, args.height, args.width, args.valid_fraction)
            name = f"{f + 1:04d}"
            Image.fromarray(rgb, "RGB").save(os.path.join(args.out, video, "render", "rgb", name + ".png"),
                                             compress_level=1)
            Image.fromarray(mask, "L").save(os.path.join(args.out, video, "render", "masks", name + ".png"),
                                            compress_level=1)
            write_exr(os.path.join(args.out, video, "render", "depth", name + ".exr"), depth, args.half)
            n += 1
    print(f"wrote {n} frames of {args.width}x{args.height} to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
