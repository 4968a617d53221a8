#!/usr/bin/env python3
"""Patches per second: patchstore.torch.PatchDataset vs the seed's decode-per-item Dataset.

Generates a small seed-like dataset (default 8 frames of 1920x1080: rgb PNG,
mask PNG, depth EXR in the seed's layout {video}/render/{rgb,masks,depth}/{frame}),
ingests it with patchstore.ingest_images, then times a DataLoader loop
(256x256 patches, rgb+mask+depth, 4 patches per item, batch_size 4 items,
collate flattening to 16 patches) with num_workers 0 and 2 over

  * PatchDataset(require="mask"), and
  * the seed's Dataset: every item decodes the three files and cuts the same
    4 patches. skimage (which the seed used) is not installed here, so it is
    emulated with pillow for the PNGs and the OpenEXR package for the EXR,
    which decode at least as fast as skimage.io.imread / pyexr.

Run:  PYTHONPATH=bindings:build-py/bindings/python python bench/python_patchdataset_bench.py
      (or with the package installed by `pip install .`)
The first epoch of each configuration (worker start-up, first decode of the
valid-position maps) is not timed. Default run: about 1-2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import OpenEXR
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import patchstore
from patchstore.torch import PatchDataset, collate

FIELDS = ("rgb", "mask", "depth")
TEMPLATES = {
    "rgb": "{video}/render/rgb/{frame}.png",
    "mask": "{video}/render/masks/{frame}.png",
    "depth": "{video}/render/depth/{frame}.exr",
}


def generate(root: Path, frames: int, h: int, w: int, seed: int = 0) -> None:
    """Render-like frames: smooth gradients and shapes plus mild noise (compresses like real renders)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    for k in range(frames):
        video, frame = f"video{k // 4 + 1:02}", f"{k % 4 + 1:04}"
        base = np.stack([(xx / w) * 255, (yy / h) * 255, ((xx + yy) / (w + h)) * 255], axis=-1)
        cy, cx, r = rng.uniform(0.2, 0.8) * h, rng.uniform(0.2, 0.8) * w, rng.uniform(0.1, 0.3) * h
        blob = ((yy - cy) ** 2 + (xx - cx) ** 2) < r * r
        base[blob] = rng.uniform(0, 255, 3)
        rgb = np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)
        mask = (blob * 255).astype(np.uint8)
        depth = (10 + 5 * np.sin(xx / 97) * np.cos(yy / 53) - 3 * blob).astype(np.float32)
        for sub in ("rgb", "masks", "depth"):
            (root / video / "render" / sub).mkdir(parents=True, exist_ok=True)
        Image.fromarray(rgb).save(root / video / "render" / "rgb" / f"{frame}.png")
        Image.fromarray(mask).save(root / video / "render" / "masks" / f"{frame}.png")
        header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
        with OpenEXR.File(header, {"Z": depth}) as f:
            f.write(str(root / video / "render" / "depth" / f"{frame}.exr"))


class SeedFrames(Dataset):
    """The seed's Dataset, with its multi-patch suggestion: per item decode rgb, mask, depth; cut k patches."""

    def __init__(self, root: Path, patch_size: int, k: int) -> None:
        self.root, self.p, self.k = root, patch_size, k
        self.items = sorted((v.name, f.stem) for v in root.iterdir() for f in (v / "render" / "rgb").iterdir())

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        video, frame = self.items[index]
        d = self.root / video / "render"
        image = np.asarray(Image.open(d / "rgb" / f"{frame}.png"))          # skimage.io.imread
        mask = np.asarray(Image.open(d / "masks" / f"{frame}.png"))
        with OpenEXR.File(str(d / "depth" / f"{frame}.exr")) as f:         # pyexr.read(...)[..., 0]
            depth = np.array(f.channels()["Z"].pixels)
        h, w = mask.shape
        p = self.p
        out = {"rgb": [], "mask": [], "depth": []}
        for _ in range(self.k):
            y, x = np.random.randint(0, h - p + 1), np.random.randint(0, w - p + 1)
            rgb = image[y:y + p, x:x + p, :3].astype(np.float32) / 255 * 2 - 1
            out["rgb"].append(torch.from_numpy(np.moveaxis(rgb, [0, 1, 2], [1, 2, 0]).copy()))
            out["mask"].append(torch.from_numpy((mask[y:y + p, x:x + p] != 0).astype(np.float32)[None]))
            out["depth"].append(torch.from_numpy(depth[y:y + p, x:x + p][None].astype(np.float32)))
        return {key: torch.stack(v) for key, v in out.items()}


def measure(ds, workers: int, epochs: int, batch_items: int, set_epoch: bool) -> tuple:
    loader = DataLoader(ds, batch_size=batch_items, shuffle=True, num_workers=workers, collate_fn=collate,
                        persistent_workers=workers > 0)
    patches = 0
    start = None
    for e in range(epochs + 1):
        if set_epoch:
            ds.set_epoch(e)
        if e == 1:
            start = time.perf_counter()
        for batch in loader:
            if e >= 1:
                patches += batch["rgb"].shape[0]
    seconds = time.perf_counter() - start
    del loader
    return patches, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--patch", type=int, default=256)
    ap.add_argument("--k", type=int, default=4, help="patches per item")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--epochs", type=int, default=40, help="timed epochs for PatchDataset")
    ap.add_argument("--seed-epochs", type=int, default=4, help="timed epochs for the seed's Dataset")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed at the end)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="patchstore-bench-"))
    try:
        data, store = work / "data", work / "frames.ps"
        t = time.perf_counter()
        if not data.exists():
            generate(data, args.frames, args.height, args.width)
        gen_s = time.perf_counter() - t
        src_bytes = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
        t = time.perf_counter()
        summary = patchstore.ingest_images(store, root=data, fields=TEMPLATES, durable=False)
        ingest_s = time.perf_counter() - t
        store_bytes = (store / "data.mdb").stat().st_size
        print(f"data: {args.frames} frames {args.width}x{args.height} (rgb png, mask png, depth exr), "
              f"{src_bytes / 2**20:.1f} MiB of files, generated in {gen_s:.1f} s")
        print(f"ingest: {summary.samples_written} new samples in {ingest_s:.2f} s, "
              f"store {store_bytes / 2**20:.1f} MiB (float32)")
        print(f"loop: {args.patch}x{args.patch} patches, fields {'+'.join(FIELDS)}, k={args.k} per item, "
              f"4 items per batch, torch threads 1, {os.cpu_count()} cores\n")
        print(f"{'dataset':<44} {'workers':>7} {'patches':>8} {'seconds':>8} {'patches/s':>10}")
        rows = []
        for w in args.workers:
            ds = PatchDataset(store, FIELDS, args.patch, patches_per_sample=args.k, require="mask", seed=0)
            n, s = measure(ds, w, args.epochs, 4, True)
            rows.append(("patchstore PatchDataset (require='mask')", w, n, s))
            print(f"{rows[-1][0]:<44} {w:>7} {n:>8} {s:>8.2f} {n / s:>10.0f}", flush=True)
        for w in args.workers:
            ds = SeedFrames(data, args.patch, args.k)
            n, s = measure(ds, w, args.seed_epochs, 4, False)
            rows.append(("seed Dataset (decode per item: pillow+OpenEXR)", w, n, s))
            print(f"{rows[-1][0]:<44} {w:>7} {n:>8} {s:>8.2f} {n / s:>10.0f}", flush=True)
        print()
        for w in args.workers:
            ps = [r for r in rows if r[1] == w]
            print(f"speed-up with {w} workers: {(ps[0][2] / ps[0][3]) / (ps[1][2] / ps[1][3]):.0f}x")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
