#!/usr/bin/env python3
"""Batches per second from page-cache-resident data: PatchSampler, BatchLoader, PatchDataset, DataLoader.

One run prints, for 256x256 windows of rgb+mask+depth (5 float32 channels,
1.31 MB per window), batch 64, k=4 windows per sample visit, require="mask":

  * memcpy: a single-thread NumPy copy of a contiguous array of one batch's
    bytes into a pre-faulted one (the reference: what one core can move);
  * PatchSampler.batch(64) with num_threads 1 and 2, into preallocated
    buffers (out=), into its own recycled buffers (out=None), and into a new
    NumPy array per batch (what a first write to fresh pages costs);
  * BatchLoader iterated in the training process, and inside a DataLoader
    with 2 workers (batch_size=None);
  * PatchDataset in a DataLoader (batch_size 16 items x k=4, collate) with
    num_workers 0 and 2;
  * a "null" Dataset returning one preallocated 1.3 MB tensor per item,
    DataLoader num_workers=2, batch 16: the cost of moving batches from
    workers to the training process, whatever the Dataset does;
  * private memory (USS, with PSS and RSS, via psutil) of each DataLoader
    worker of PatchDataset and BatchLoader with 2 workers.

Data: `--frames` generated 1920x1080 seed-layout frames (rgb PNG, mask PNG,
depth EXR; see python_patchdataset_bench.py), each ingested `--repeat`
times under different ids (so an epoch has enough windows without
generating many files): by default 32 samples, a 1.3 GB store. It is read
once before timing so that it is in the page cache, and mapped once in the
training process (map_store). All loops only count
what they receive (no training step). The first epoch / batches of each
configuration are not timed.

Run:  PYTHONPATH=bindings:build-py/bindings/python python bench/python_sampler_bench.py
Default run: about 2 minutes on 2 cores.
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
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

import patchstore
from patchstore.torch import BatchLoader, PatchDataset, collate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_patchdataset_bench import FIELDS, generate  # noqa: E402

P, K, BATCH = 256, 4, 64


def manifest(data: Path, repeat: int) -> Path:
    """A manifest naming every generated frame `repeat` times (ids <video>/<frame>/<copy>)."""
    lines = ["id,rgb,mask,depth"]
    for v in sorted(p for p in data.iterdir() if p.is_dir()):
        for f in sorted((v / "render" / "rgb").iterdir()):
            frame = f.stem
            for r in range(repeat):
                lines.append(f"{v.name}/{frame}/{r},{v.name}/render/rgb/{frame}.png,"
                             f"{v.name}/render/masks/{frame}.png,{v.name}/render/depth/{frame}.exr")
    path = data / "manifest.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def warm_page_cache(store: Path) -> None:
    with open(store / "data.mdb", "rb") as f:
        while f.read(64 << 20):
            pass


def map_store(store: patchstore.Store) -> None:
    """Touches every record through the memory map, so that this process's first-touch (minor) page
    faults on the map are not timed. (Processes that open the store anew -- DataLoader workers -- pay
    them again; they are part of their figures.)"""
    for i in range(len(store)):
        for f in FIELDS:
            float(store.get(i, f).sum())


ROUNDS = 5


def row(name: str, result: tuple, extra: str = "") -> None:
    patches, seconds, rate = result
    gbs = rate * 5 * P * P * 4 / 1e9
    print(f"{name:<60} {patches:>7} {seconds:>6.2f} {rate:>9.0f} {gbs:>6.2f}  {extra}", flush=True)


def timed(step, min_seconds: float) -> tuple:
    """Runs step() (returning patches) in ROUNDS rounds of min_seconds / ROUNDS each.

    Returns (patches, seconds, median patches/s over the rounds): the median
    keeps a noisy neighbour on a shared machine from deciding the figure.
    """
    total, elapsed, rates = 0, 0.0, []
    for _ in range(ROUNDS):
        n, start = 0, time.perf_counter()
        while True:
            n += step()
            t = time.perf_counter() - start
            if t >= min_seconds / ROUNDS:
                break
        total, elapsed = total + n, elapsed + t
        rates.append(n / t)
    return total, elapsed, float(np.median(rates))


def loader_epochs(make_iter, min_seconds: float, set_epoch=None) -> tuple:
    """Epoch loops over make_iter() after one untimed epoch; returns timed()'s figures."""
    e = 0

    def epoch():
        nonlocal e
        if set_epoch:
            set_epoch(e)
        e += 1
        n = 0
        for batch in make_iter():
            n += batch["rgb"].shape[0]
        return n

    epoch()  # untimed: worker start-up, first use of each sample
    return timed(epoch, min_seconds)


class NullDataset(Dataset):
    """Returns the same preallocated (5, 256, 256) float32 tensor (1.31 MB) for every item."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.item = torch.zeros((5, P, P), dtype=torch.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.item


def memory_of(pids) -> str:
    parts = []
    for pid in pids:
        m = psutil.Process(pid).memory_full_info()
        parts.append(f"USS {m.uss / 2**20:.0f} MiB (PSS {m.pss / 2**20:.0f}, RSS {m.rss / 2**20:.0f})")
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=8, help="generated 1920x1080 frames")
    ap.add_argument("--repeat", type=int, default=4, help="ids per generated frame in the store")
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--seconds", type=float, default=4.0, help="minimum timed seconds per configuration")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed at the end)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="patchstore-sampler-bench-"))
    try:
        data, store = work / "data", work / "frames.ps"
        t = time.perf_counter()
        if not data.exists():
            generate(data, args.frames, args.height, args.width)
        gen_s = time.perf_counter() - t
        t = time.perf_counter()
        summary = patchstore.ingest_images(store, manifest=manifest(data, args.repeat), durable=False)
        ingest_s = time.perf_counter() - t
        warm_page_cache(store)
        opened = patchstore.open(store)
        map_store(opened)
        size = (store / "data.mdb").stat().st_size
        samples = len(opened)
        per_epoch = samples * K
        batch_bytes = BATCH * 5 * P * P * 4
        print(f"data: {args.frames} generated {args.width}x{args.height} frames x {args.repeat} ids = {samples} "
              f"samples (generated in {gen_s:.1f} s, {summary.samples_written} ingested in {ingest_s:.1f} s); "
              f"store {size / 2**20:.0f} MiB, read into the page cache")
        print(f"windows {P}x{P}, fields {'+'.join(FIELDS)} (5 float32 channels, {5 * P * P * 4 / 1e6:.2f} MB per "
              f"window), batch {BATCH} ({batch_bytes / 1e6:.1f} MB), k={K}, require='mask'; {per_epoch} windows "
              f"per epoch; {os.cpu_count()} cores, torch threads 1, torch {torch.__version__}, "
              f"numpy {np.__version__}\n")
        print(f"{'configuration':<60} {'patches':>7} {'secs':>6} {'patches/s':>9} {'GB/s':>6}  "
              f"(rates: median of {ROUNDS} rounds)")

        # -- the reference: one core copying one batch's bytes -------------------------------
        src = np.ones(batch_bytes // 4, dtype=np.float32)
        dst = np.zeros_like(src)  # zeros_like writes: pre-faulted
        row("memcpy reference (np.copyto, 1 thread, same bytes)",
            timed(lambda dst=dst, src=src: (np.copyto(dst, src), BATCH)[1], args.seconds / 2))
        del src, dst

        # -- PatchSampler.batch ------------------------------------------------------------------
        for threads in (1, 2):
            sampler = patchstore.PatchSampler(opened, FIELDS, P, patches_per_sample=K, require="mask",
                                              num_threads=threads)
            out = {f: np.zeros(shape, np.float32) for f, shape in sampler.shapes(BATCH).items()}
            for _ in range(max(2, per_epoch // BATCH + 1)):  # untimed: every sample's windows found once
                sampler.batch(BATCH, out=out)
            row(f"PatchSampler.batch(64, out=preallocated), num_threads={threads}",
                timed(lambda s=sampler, o=out: s.batch(BATCH, out=o)["rgb"].shape[0], args.seconds))
            if threads == 1:
                row("PatchSampler.batch(64) (its recycled buffers), num_threads=1",
                    timed(lambda s=sampler: s.batch(BATCH)["rgb"].shape[0], args.seconds / 2))

                def fresh(s=sampler):
                    o = {f: np.empty(shape, np.float32) for f, shape in s.shapes(BATCH).items()}
                    return s.batch(BATCH, out=o)["rgb"].shape[0]

                row("PatchSampler.batch(64, out=new np.empty per batch), 1 thread", timed(fresh, args.seconds / 2),
                    "(first touch of fresh pages)")
            del sampler, out

        # -- BatchLoader -------------------------------------------------------------------------
        for threads in (1, 2):
            ld = BatchLoader(opened, FIELDS, P, BATCH, patches_per_sample=K, require="mask", num_threads=threads)
            row(f"BatchLoader in the training process, num_threads={threads}",
                loader_epochs(lambda ld=ld: ld, args.seconds))
        ld = BatchLoader(store, FIELDS, P, BATCH, patches_per_sample=K, require="mask")
        dl = DataLoader(ld, batch_size=None, num_workers=2, persistent_workers=True)
        result = loader_epochs(lambda dl=dl: dl, args.seconds)
        bl_memory = memory_of([w.pid for w in dl._iterator._workers])
        row("BatchLoader in DataLoader(num_workers=2, batch_size=None)", result)
        del dl

        # -- PatchDataset --------------------------------------------------------------------------
        pd_memory = ""
        for workers in (0, 2):
            ds = PatchDataset(store, FIELDS, P, patches_per_sample=K, require="mask")
            dl = DataLoader(ds, batch_size=BATCH // K, shuffle=True, num_workers=workers, collate_fn=collate,
                            persistent_workers=workers > 0)
            result = loader_epochs(lambda dl=dl: dl, args.seconds, ds.set_epoch)
            if workers:
                pd_memory = memory_of([w.pid for w in dl._iterator._workers])
            row(f"PatchDataset, DataLoader(batch_size=16 items, num_workers={workers})", result)
            del dl

        # -- the DataLoader's own cost ---------------------------------------------------------
        null = NullDataset(16 * 32)
        dl = DataLoader(null, batch_size=16, num_workers=2, persistent_workers=True)

        def null_epoch(dl=dl):
            return sum(b.shape[0] for b in dl)

        null_epoch()
        row("null Dataset (1.3 MB tensor per item), num_workers=2, batch 16", timed(null_epoch, args.seconds),
            "(samples/s)")
        del dl

        print(f"\nper-worker private memory, store {size / 2**20:.0f} MiB, 2 workers (after the timed epochs):")
        print(f"  PatchDataset workers: {pd_memory}")
        print(f"  BatchLoader workers:  {bl_memory}")
        print(f"  training process:     {memory_of([os.getpid()])}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
