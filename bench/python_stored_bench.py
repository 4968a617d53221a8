#!/usr/bin/env python3
"""Stored bytes against float32: what output="stored" saves on the DataLoader path and on the way to a device.

Generates seed-like 1920x1080 frames (rgb PNG, mask PNG, depth EXR; bench/python_patchdataset_bench.py's
generator), ingests them once as `--layout tiles --encoding compact` and once more with `depth=float16`, then
measures, per store, in windows/s (256x256 rgb+mask+depth, 4 windows per frame visit, mask required):

  * DataLoader(PatchDataset, num_workers=W, collate) with output="float32" against output="stored",
    delivered as a float32 batch in the training process's memory on --device (default cpu): the float32
    batch copied there (what pin_memory or .to(device) does), the stored one converted there by
    patchstore.torch.to_float; and both as the workers left them (untouched);
  * BatchLoader in the training process: float32, output="stored", and device=--device (stored bytes
    gathered, copied, converted there), with --threads gather threads;
  * bytes per window that cross from the loader to the device.

Every configuration runs --repeats times after one untimed warm-up epoch; the figures are the range.
With --device cuda it also checks that the device batches equal the CPU float32 batches bit for bit and
measures the pinned host-to-device copy ceiling (bench/gpu/run.sh runs it so).

Run:  PYTHONPATH=bindings:build/bindings/python python bench/python_stored_bench.py
Default run: about 2-3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
from torch.utils.data import DataLoader

import patchstore
from patchstore.torch import BatchLoader, PatchDataset, collate, to_float

FIELDS = ("rgb", "mask", "depth")


def timed(run: Callable[[], int], repeats: int) -> List[float]:
    """windows/s of `run` (which returns the windows it delivered), after one warm-up run."""
    run()
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        n = run()
        rates.append(n / (time.perf_counter() - t))
    return rates


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def dataloader_run(ds: PatchDataset, workers: int, epochs: int, consume: str,
                   device: torch.device) -> Callable[[], int]:
    """windows of `epochs` epochs through DataLoader(ds, num_workers=workers), each batch consumed as:
    "raw" (left where the workers put it), "land" (float32 copied into reused memory on `device`, as
    pin_memory's copy or .to(device) does) or "to_float" (stored bytes converted into float32 on `device`)."""
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers, collate_fn=collate,
                        persistent_workers=workers > 0, pin_memory=device.type == "cuda")
    state = {"epoch": 0}
    landed: Dict[Tuple[str, Tuple[int, ...]], torch.Tensor] = {}

    def run() -> int:
        n = 0
        for _ in range(epochs):
            ds.set_epoch(state["epoch"])
            state["epoch"] += 1
            for batch in loader:
                if consume == "to_float":
                    batch = to_float(batch, ds, device=device, non_blocking=True)
                elif consume == "land":
                    batch = {f: landed.setdefault((f, tuple(t.shape)), torch.empty(t.shape, device=device))
                             .copy_(t, non_blocking=True) for f, t in batch.items()}
                n += batch["rgb"].shape[0]
        sync(device)
        return n
    return run


def loader_run(loader: BatchLoader, epochs: int, device: torch.device, to_device: bool) -> Callable[[], int]:
    def run() -> int:
        n = 0
        for _ in range(epochs):
            for batch in loader:
                if to_device:
                    batch = {f: t.to(device, non_blocking=True) for f, t in batch.items()}
                n += batch["rgb"].shape[0]
        sync(device)
        return n
    return run


def fmt(rates: List[float]) -> str:
    lo, hi = min(rates), max(rates)
    return f"{lo:,.0f}" if round(lo) == round(hi) else f"{lo:,.0f}–{hi:,.0f}"


def check_device_bits(store: str, device: torch.device, threads: int) -> str:
    """Device batches (stored bytes converted there) against the CPU float32 batches, every byte."""
    opts = dict(patch_size=256, batch_size=64, patches_per_sample=4, require="mask", flip=True, rot90=True,
                num_threads=threads, seed=1)
    ref = BatchLoader(store, list(FIELDS), **opts)
    dev = BatchLoader(store, list(FIELDS), device=device, **opts)
    batches = 0
    for want, got in zip(ref.batches(0), dev.batches(0)):
        for f in FIELDS:
            g = got[f].cpu()
            if g.dtype != torch.float32 or g.numpy().tobytes() != want[f].numpy().tobytes():
                raise SystemExit(f"device batch {batches} field {f} differs from the CPU float32 batch")
        batches += 1
    return f"bit-identical: {batches} batches x {len(FIELDS)} fields"


def copy_ceiling(device: torch.device) -> str:
    """Pinned host-to-device copy bandwidth (256 MiB, 10 copies)."""
    x = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    y = torch.empty_like(x, device=device)
    y.copy_(x, non_blocking=True)
    sync(device)
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x, non_blocking=True)
    sync(device)
    gbs = 10 * x.numel() / (time.perf_counter() - t) / 1e9
    return f"{gbs:.1f} GB/s pinned = {gbs * 1e9 / 1.31e6:,.0f} float32 windows/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--threads", type=int, nargs="+", default=[2], help="BatchLoader gather threads")
    ap.add_argument("--windows", type=int, default=1536, help="windows per timed run (at least)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="where to_float / device= convert (cpu or cuda)")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed at the end)")
    ap.add_argument("--store", action="append", default=[], metavar="NAME=PATH",
                    help="measure this store (rgb, mask, depth fields) instead of generating and ingesting frames; "
                         "repeatable (bench/gpu/run.sh passes stores written without ingest)")
    args = ap.parse_args()

    device = torch.device(args.device)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="patchstore-stored-"))
    try:
        stores: Dict[str, str] = dict(s.rsplit("=", 1) for s in args.store)
        data = work / "data"
        if not stores:
            # The frame generator needs OpenEXR and Pillow, which a GPU node may lack: imported only here.
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from python_patchdataset_bench import FIELDS as GENERATED
            from python_patchdataset_bench import TEMPLATES, generate
            assert tuple(GENERATED) == FIELDS
            if not data.exists():
                generate(data, args.frames, 1080, 1920)
        for name, encoding in (() if args.store else
                               (("tiles+compact", "compact"),
                                ("tiles+compact, depth=float16", ["compact", "depth=float16"]))):
            path = str(work / f"{len(stores)}.ps")
            if not Path(path).exists():
                patchstore.ingest_images(path, root=data, fields=TEMPLATES, durable=False, layout="tiles",
                                         encoding=encoding)
            stores[name] = path
        frames = len(patchstore.Store(next(iter(stores.values()))))
        print(f"data: {frames} frames 1920x1080, windows 256x256 {'+'.join(FIELDS)}, 4 per visit, "
              f"require='mask'; {os.cpu_count()} cores, torch {torch.__version__}, device {device}"
              + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
        rows: List[Tuple[str, str, str]] = []

        def row(store: str, what: str, value: str) -> None:
            rows.append((store, what, value))
            print(f"{store:<30} {what:<62} {value:>16}", flush=True)

        for name, path in stores.items():
            probe = next(iter(BatchLoader(path, list(FIELDS), patch_size=256, batch_size=1,
                                          output="stored").batches(0)))
            stored_b = sum(t[0].numel() * t.element_size() for t in probe.values())
            row(name, "bytes per window to the device: float32 / stored",
                f"{4 * 5 * 256 * 256 / 1e6:.2f} / {stored_b / 1e6:.2f} MB")
            opts = dict(patch_size=256, patches_per_sample=4, require="mask", seed=0)
            for w in args.workers:
                # Delivered: a float32 batch in the training process's memory on the device (the float32
                # batch copied there as pin_memory / .to(device) does, or the stored batch converted there);
                # as left: the batch where the workers put it, untouched.
                for output, consume, label in (("float32", "land", "float32, delivered"),
                                               ("stored", "to_float", "stored + to_float, delivered"),
                                               ("float32", "raw", "float32, as left"),
                                               ("stored", "raw", "stored, as left")):
                    ds = PatchDataset(path, FIELDS, output=output, **opts)
                    epochs = -(-args.windows // (4 * len(ds)))
                    rates = timed(dataloader_run(ds, w, epochs, consume, device), args.repeats)
                    row(name, f"DataLoader(PatchDataset, num_workers={w}): {label}", fmt(rates) + " w/s")
            for t in args.threads:
                for label, kw, to_dev in (("float32", {}, device.type != "cpu"),
                                          ("output='stored'", {"output": "stored"}, False),
                                          (f"device='{device}'", {"device": device}, False)):
                    loader = BatchLoader(path, list(FIELDS), batch_size=64, num_threads=t,
                                         pin_memory=device.type == "cuda", **opts, **kw)
                    epochs = -(-args.windows // len(loader.sampler))
                    rates = timed(loader_run(loader, epochs, device, to_dev), args.repeats)
                    row(name, f"BatchLoader(num_threads={t}, {label})" + (" + .to(device)" if to_dev else ""),
                        fmt(rates) + " w/s")
            if device.type == "cuda":
                row(name, "device batches against CPU float32 batches", check_device_bits(path, device,
                                                                                      max(args.threads)))
        if device.type == "cuda":
            row("-", "host-to-device copy ceiling", copy_ceiling(device))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
