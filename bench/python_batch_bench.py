#!/usr/bin/env python3
"""Batch-size dependence of the in-process batch paths (issue 17, item 5): no cliff at batch 32/64.

Measures, in the training process (no DataLoader workers, torch 1 thread):

  * SliceDataset.__getitems__ + slice_collate, 2.5D: context=2, fields MR, CT,
    MASK, whole 256x256 slices: one field of a batch of 32 is 42 MB;
  * PatchDataset.__getitems__ + collate: rgb, mask, depth, 256x256 windows,
    require="mask": rgb of a batch of 64 is 50 MB;

for batch 16, 32 and 64, each in a fresh process, in four settings:

  * pool off / on: patchstore.torch._common._POOL_BATCH_BUFFERS (off = a new tensor
    per batch and field, what the datasets did before buffers were pooled);
  * default environment / MALLOC_MMAP_THRESHOLD_=268435456 (glibc serves the
    allocations from the heap, not fresh mappings).

Above glibc's mmap threshold (32 MiB at most) a fresh tensor per batch is a
fresh mapping: every 4 KiB page faults and is zeroed on first touch, and the
mapping is unmapped again on free.

Run:  PYTHONPATH=bindings:build/bindings/python python bench/python_batch_bench.py [--seconds 3] [--rounds 3]
Writes a Markdown table to bench/results/batch_sizes.md (--out). About 2
minutes per round on 2 cores, 0.5 GB of temporary files.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TUNED = {"MALLOC_MMAP_THRESHOLD_": "268435456"}


def child(kind: str, store: str, batch: int, pool: bool, seconds: float) -> None:
    import numpy as np
    import torch

    import patchstore.torch as pt

    torch.set_num_threads(1)
    pt._common._POOL_BATCH_BUFFERS = pool
    rng = np.random.default_rng(0)
    if kind == "slices":
        ds = pt.SliceDataset(store, ("MR", "CT", "MASK"), context=2)
        coll = pt.slice_collate
    else:
        ds = pt.PatchDataset(store, ["rgb", "mask", "depth"], patch_size=256, require="mask")
        coll = pt.collate
    n = len(ds)

    def one() -> None:
        out = coll(ds.__getitems__(rng.integers(0, n, batch).tolist()))
        del out

    for _ in range(3):  # warm-up: page cache, pool
        one()
    items, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        one()
        items += batch
    print(json.dumps({"items_per_s": items / (time.perf_counter() - t0)}))


def make_stores(work: Path) -> tuple:
    import h5py
    import numpy as np

    import patchstore

    rng = np.random.default_rng(0)
    with h5py.File(work / "v.h5", "w") as f:
        for p in range(6):
            for g in ("MR", "CT", "MASK"):
                f.create_dataset(f"{g}/p{p}", data=rng.random((256, 256, 48), dtype=np.float32))
    patchstore.ingest_hdf5(work / "v.h5", work / "v.ps", groups=("MR", "CT", "MASK"), durable=False)
    subprocess.run([sys.executable, str(HERE.parent / "tools" / "make_frames.py"), str(work / "data"),
                    "--videos", "1", "--frames", "6"], check=True, stdout=subprocess.DEVNULL)
    patchstore.ingest_images(work / "f.ps", root=work / "data",
                             fields={"rgb": "{video}/render/rgb/{frame}.png",
                                     "mask": "{video}/render/masks/{frame}.png",
                                     "depth": "{video}/render/depth/{frame}.exr"}, durable=False)
    return str(work / "v.ps"), str(work / "f.ps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each cell is their median")
    ap.add_argument("--out", default=str(HERE / "results" / "batch_sizes.md"))
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, store, batch, pool, seconds = a.child
        child(kind, store, int(batch), pool == "1", float(seconds))
        return
    work = Path(tempfile.mkdtemp(prefix="ps_batch_bench_"))
    try:
        vol, frames = make_stores(work)
        configs = [(kind, store, what, batch, pool, tuned)
                   for kind, store, what in (("slices", vol, "SliceDataset 2.5D (context=2, 3 fields, 256x256)"),
                                             ("patches", frames, "PatchDataset (rgb+mask+depth, 256x256)"))
                   for batch in (16, 32, 64) for pool in (False, True) for tuned in (False, True)]
        results: dict = {c: [] for c in configs}
        # Rounds interleave every configuration, so a busy spell on a shared machine hits them all alike;
        # each cell is the median over the rounds.
        for rnd in range(a.rounds):
            for c in configs:
                kind, store, what, batch, pool, tuned = c
                r = subprocess.run([sys.executable, __file__, "--child", kind, store, str(batch),
                                    "1" if pool else "0", str(a.seconds)],
                                   env=dict(os.environ, **(TUNED if tuned else {})), capture_output=True, text=True,
                                   check=True)
                v = json.loads(r.stdout.strip().splitlines()[-1])["items_per_s"]
                results[c].append(v)
                print(rnd, kind, batch, "pool" if pool else "fresh", "tuned" if tuned else "default", f"{v:,.0f}",
                      flush=True)
        rows = []
        for kind, store, what in (("slices", vol, "SliceDataset 2.5D (context=2, 3 fields, 256x256)"),
                                  ("patches", frames, "PatchDataset (rgb+mask+depth, 256x256)")):
            for batch in (16, 32, 64):
                row = [what, str(batch)]
                for pool in (False, True):
                    for tuned in (False, True):
                        row.append(f"{statistics.median(results[(kind, store, what, batch, pool, tuned)]):,.0f}")
                rows.append(row)
        unit = "items/s (slices for SliceDataset, windows for PatchDataset)"
        lines = [
            "### Python: batch size and glibc's mmap threshold (in-process batches)",
            "",
            f"`bench/python_batch_bench.py --seconds {a.seconds:g} --rounds {a.rounds}`: {unit}, median of the "
            "rounds; `__getitems__` + collate in the "
            f"training process, torch 1 thread, {os.cpu_count()} cores ({platform.machine()}). \"before\": a new "
            "tensor per batch and field (`_POOL_BATCH_BUFFERS = False`); \"after\": pooled buffers. \"tuned\": "
            "`MALLOC_MMAP_THRESHOLD_=268435456` in the environment.",
            "",
            "| dataset | batch | before, default | before, tuned | after, default | after, tuned |",
            "|---|---:|---:|---:|---:|---:|",
        ] + ["| " + " | ".join(r) + " |" for r in rows] + [
            "",
            "Figures on this shared 2-core machine vary between runs; compare within a row.",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        Path(a.out).write_text(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
