#!/usr/bin/env python3
"""Generate a small synthetic MR/CT dataset in the volumes quick start's HDF5 layout (SynthRAD-like).

    OUT (HDF5, gzip)
      MR/<patient>     (H, W, slices) int16, 0..~2000 (MR intensities)
      CT/<patient>     (H, W, slices) int16, -1024..~1400 HU (air, fat, soft tissue, bone)
      MASK/<patient>   (H, W, slices) uint8, 1 inside the body, 0 outside

Each patient is an elliptic body with a fat rim, soft tissue and a bony ring,
its size changing along the slices. Deterministic for a given --seed.

    python tools/make_volumes.py synthrad.h5                                   # 3 patients, 256x256x24
    python tools/make_volumes.py small.h5 --patients 2 --size 64 --slices 4
"""
import argparse
import sys

import numpy as np


def make_patient(rng, size, slices):
    """(mr, ct, mask) of one patient, each (size, size, slices)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    cy, cx = size / 2 + rng.uniform(-0.05, 0.05, 2) * size
    ry, rx = size * rng.uniform(0.30, 0.40), size * rng.uniform(0.38, 0.46)
    mr = np.empty((size, size, slices), np.int16)
    ct = np.empty((size, size, slices), np.int16)
    mask = np.empty((size, size, slices), np.uint8)
    for k in range(slices):
        s = 0.85 + 0.15 * np.sin(np.pi * (k + 0.5) / slices)  # the body is widest in the middle slices
        r = np.sqrt(((yy - cy) / (ry * s)) ** 2 + ((xx - cx) / (rx * s)) ** 2)  # < 1 inside the body
        body, fat, bone = r < 1, (r >= 0.9) & (r < 1), (r >= 0.45) & (r < 0.55)
        hu = np.full((size, size), -1000.0, np.float32)
        hu[body] = 40
        hu[fat] = -100
        hu[bone] = 700 + 600 * (1 - np.abs(r[bone] - 0.5) / 0.05)  # cortical peak in the ring's middle
        hu += rng.normal(0, 15, hu.shape)
        ct[..., k] = np.clip(hu, -1024, 3000).astype(np.int16)
        t1 = np.zeros((size, size), np.float32)
        t1[body] = 900
        t1[fat] = 1600
        t1[bone] = 200
        t1[body] += rng.normal(0, 40, int(body.sum()))
        mr[..., k] = np.clip(t1, 0, 3000).astype(np.int16)
        mask[..., k] = body
    return mr, ct, mask


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="synthrad.h5", help="output HDF5 file (default synthrad.h5)")
    ap.add_argument("--patients", type=int, default=3)
    ap.add_argument("--size", type=int, default=256, help="height and width of each slice")
    ap.add_argument("--slices", type=int, default=24, help="slices per patient")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import h5py

    rng = np.random.default_rng(args.seed)
    with h5py.File(args.out, "w") as f:
        for p in range(args.patients):
            patient = f"1PA{p + 1:03d}"
            for group, volume in zip(("MR", "CT", "MASK"), make_patient(rng, args.size, args.slices)):
                f.create_dataset(f"{group}/{patient}", data=volume, compression="gzip")
    print(f"wrote {args.patients} patients of {args.size}x{args.size}x{args.slices} (MR, CT, MASK) to {args.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
