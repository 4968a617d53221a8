#!/usr/bin/env python3
"""Per-item access: SliceDataset[i] and PatchDataset[i] against a bare numpy.memmap copy of the same bytes.

What a DataLoader with batch_size=None or a custom sampler does, and what
users write first: one item at a time, in one process, no workers.

  * slices: a volume store (default 8 volumes of 32 x 256 x 256, fields MR,
    CT, MASK); item i = flat slice i of every field, (1, 256, 256) float32
    each. Baseline: the same float32 values in one raw file per field,
    opened with numpy.memmap as (slices, 256, 256); an item is
    ``torch.from_numpy(np.array(mm[f][i:i + 1]))`` for each field.
  * patches: an image store (default 16 frames of 512 x 512, fields rgb,
    mask, depth); item i = one 128 x 128 window of sample i (require="mask").
    Baseline: the same values as raw (N, C, H, W) files, an item is
    ``torch.from_numpy(np.array(mm[f][s, :, y:y+P, x:x+P]))`` per field at the
    window PatchDataset draws (positions computed before timing, so the
    baseline pays nothing for sampling).

Indices are a fixed random permutation, the same for both sides; after 64
untimed items each, the two sides run in alternating rounds of 128 items for
about --seconds each (so load from other processes hits both alike); files
are in the page cache. torch uses one thread.

Run:  PYTHONPATH=bindings:build/bindings/python python bench/python_item_bench.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import h5py
import numpy as np
import torch
from PIL import Image

import patchstore
from patchstore.torch import PatchDataset, SliceDataset


def compare(fns: Dict[str, Callable[[int], object]], order: Sequence[int], seconds: float) -> Dict[str, float]:
    """Items/s of each fn, timed in alternating rounds of 128 items (so a busy machine slows all alike)."""
    for fn in fns.values():
        for i in order[:64]:
            fn(i)
    spent = {k: 0.0 for k in fns}
    done = {k: 0 for k in fns}
    chunks = [order[j:j + 128] for j in range(0, len(order), 128)]
    end = time.perf_counter() + seconds * len(fns)
    r = 0
    while time.perf_counter() < end:
        chunk = chunks[r % len(chunks)]
        r += 1
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for i in chunk:
                fn(i)
            spent[k] += time.perf_counter() - t0
            done[k] += len(chunk)
    return {k: done[k] / spent[k] for k in fns}


def slices(work: Path, volumes: int, depth: int, size: int, seconds: float) -> Dict[str, float]:
    rng = np.random.default_rng(0)
    fields = ("MR", "CT", "MASK")
    src = work / "v.h5"
    with h5py.File(src, "w") as f:
        for g in fields:
            for v in range(volumes):
                a = rng.random((depth, size, size), dtype=np.float32)
                if g == "MASK":
                    a = (a > 0.5).astype(np.uint8)
                f.create_dataset(f"{g}/p{v:03}", data=a, chunks=(1, size, size))
    store = work / "v.ps"
    patchstore.ingest_hdf5(src, store, slice_axis=0, durable=False, progress=False)
    ds = SliceDataset(store, fields)
    st = ds.store
    mm = {}
    for f in fields:
        raw = work / f"{f}.f32"
        with open(raw, "wb") as out:
            for v in range(ds.index.volume_count):
                out.write(np.ascontiguousarray(st.get(ds.index.sample(v), f)).tobytes())
        mm[f] = np.memmap(raw, dtype=np.float32, mode="r").reshape(-1, size, size)
    order = rng.permutation(len(ds)).tolist()
    for i in order[:16]:  # same bytes
        for f, t in zip(fields, ds[i]):
            assert np.array_equal(t.numpy(), mm[f][i:i + 1])

    def bare(i: int):
        return tuple(torch.from_numpy(np.array(mm[f][i:i + 1])) for f in fields)

    return compare({"memmap": bare, "dataset": ds.__getitem__}, order, seconds)


def patches(work: Path, frames: int, size: int, patch: int, seconds: float) -> Dict[str, float]:
    rng = np.random.default_rng(1)
    root = work / "frames"
    for k in range(frames):
        d = root / f"f{k:03}"
        d.mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(d / "rgb.png")
        m = np.zeros((size, size), np.uint8)
        m[size // 4:3 * size // 4, size // 4:3 * size // 4] = 255
        Image.fromarray(m).save(d / "mask.png")
        Image.fromarray(rng.integers(0, 65536, (size, size), dtype=np.uint16)).save(d / "depth.png")
    store = work / "f.ps"
    patchstore.ingest_images(store, root=root, fields={"rgb": "{f}/rgb.png", "mask": "{f}/mask.png",
                                                       "depth": "{f}/depth.png"}, durable=False, progress=False)
    fields = ("rgb", "mask", "depth")
    ds = PatchDataset(store, list(fields), patch, require="mask")
    st = ds.store
    mm = {}
    for f in fields:
        raw = work / f"{f}.f32"
        with open(raw, "wb") as out:
            for s in range(len(st)):
                out.write(np.ascontiguousarray(st.get(s, f)).tobytes())
        mm[f] = np.memmap(raw, dtype=np.float32, mode="r").reshape(len(st), -1, size, size)
    order = rng.permutation(len(ds)).tolist()
    where = {i: ds.positions(i) for i in order}
    where = {i: (s, int(ys[0]), int(xs[0])) for i, (s, ys, xs) in where.items()}
    for i in order[:16]:
        s, y, x = where[i]
        item = ds[i]
        for f in fields:
            assert np.array_equal(item[f].numpy(), mm[f][s, :, y:y + patch, x:x + patch])

    def bare(i: int):
        s, y, x = where[i]
        return {f: torch.from_numpy(np.array(mm[f][s, :, y:y + patch, x:x + patch])) for f in fields}

    return compare({"memmap": bare, "dataset": ds.__getitem__}, order, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--volumes", type=int, default=8)
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--slice", type=int, default=256)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--frame-size", type=int, default=512)
    ap.add_argument("--patch", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="ps-item-bench-"))
    try:
        rows: List[tuple] = []
        r = slices(work, a.volumes, a.depth, a.slice, a.seconds)
        rows.append((f"SliceDataset[i], 3 fields x (1, {a.slice}, {a.slice})", r))
        r = patches(work, a.frames, a.frame_size, a.patch, a.seconds)
        rows.append((f"PatchDataset[i], rgb+mask+depth {a.patch}x{a.patch}", r))
        print("| access | numpy.memmap items/s | patchstore items/s | ratio |")
        print("|---|---:|---:|---:|")
        for name, r in rows:
            print(f"| {name} | {r['memmap']:,.0f} | {r['dataset']:,.0f} | {r['dataset'] / r['memmap']:.2f}x |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
