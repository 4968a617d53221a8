#!/usr/bin/env python3
"""Slices per second: patchstore.torch.SliceDataset vs the seed's h5py Dataset (random 2D slices of 3D volumes).

Writes the seed's file (default 12 patients of 256x256x96, groups MR, CT and
MASK: MR/CT float32 pre-normalised to about [-1, 1], MASK uint8) in two
layouts:

  * the seed's: (H, W, S) datasets, gzip, h5py's automatic chunks;
  * the layout usually recommended for slice reads: (S, H, W) datasets,
    chunks (1, H, W), no compression;

ingests the seed's file once with patchstore.ingest_hdf5, then times random
slice access (DataLoader(shuffle=True), batches of 32 items; an item is one
256x256 slice of MR, CT and MASK, 768 KiB of float32) for

  * the seed's Dataset (dataset_synthRAD_FLY without the misalignment and
    motion options: a slice index built in __init__, the file opened per
    worker, MR/CT/MASK read with h5py, torch.from_numpy(x[None])), on both
    layouts, without and with its MONAI augmentation (RandFlipd +
    RandRotate90d, prob 0.5 each) and torch.clamp(-1, 1);
  * SliceDataset(fields=("MR", "CT", "MASK")) through the same DataLoader,
    without and with flip=True, rot90=True, clamp to [-1, 1] on MR/CT;
  * SliceDataset.__getitems__ called directly with 32 random indices
    (what the DataLoader's fetcher calls; no worker processes).

Mask-aware rows (--mask-only runs them alone and replaces their section of
--out): the 2.5D MR->CT recipe, SliceDataset(("MR", "CT", "MASK"),
context={"MR": 1}, crop=128, flip=True, rot90=True) through __getitems__,
without a mask rule, with require="MASK" (min_valid 1 voxel, and half the
crop), and with positive_fraction=0.8; plus the time to build each dataset
(with require: reading every mask slice once to find those that qualify).

Each configuration runs for --seconds after one untimed warm-up batch
(worker start-up excluded; persistent workers across epochs). All files are
in the page cache (warm reads): the numbers are the CPU cost of getting a
slice out of each format. torch uses one thread per process.

Run:  PYTHONPATH=bindings:build/bindings/python python bench/python_slices_bench.py
Prints a Markdown table and writes it to bench/results/slices.md (--out).
Default run: about 2-3 minutes on 2 cores, 2 GiB of temporary files.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, List, Tuple

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import patchstore
from patchstore.torch import SliceDataset, slice_collate

GROUPS = ("MR", "CT", "MASK")
HERE = Path(__file__).resolve().parent


def volume(rng: np.random.Generator, H: int, W: int, S: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An MR-, CT- and mask-like volume, (S, H, W): a body ellipse with organs, smooth shading, mild noise."""
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    cy, cx = H / 2 + rng.uniform(-8, 8), W / 2 + rng.uniform(-8, 8)
    ry, rx = H * rng.uniform(0.30, 0.38), W * rng.uniform(0.38, 0.45)
    organs = [(rng.uniform(0.3, 0.7) * H, rng.uniform(0.3, 0.7) * W, rng.uniform(6, 20), rng.uniform(-0.4, 0.6))
              for _ in range(6)]
    mr = np.empty((S, H, W), np.float32)
    ct = np.empty((S, H, W), np.float32)
    mask = np.empty((S, H, W), np.uint8)
    for s in range(S):
        z = s / max(S - 1, 1) - 0.5
        body = ((yy - cy) / (ry * (1 - z * z))) ** 2 + ((xx - cx) / rx) ** 2 < 1
        m = np.where(body, 0.2 + 0.2 * np.sin(xx / 23 + z) * np.cos(yy / 31), -1.0).astype(np.float32)
        c = np.where(body, 0.05 + 0.1 * np.cos(xx / 41 - z), -1.0).astype(np.float32)
        for oy, ox, r, v in organs:
            inside = body & (((yy - oy) ** 2 + (xx - ox) ** 2) < (r * (1 - abs(z))) ** 2)
            m[inside] = v
            c[inside] = v * 0.8 + 0.1
        mr[s] = m + rng.normal(0, 0.02, (H, W)).astype(np.float32) * body
        ct[s] = c + rng.normal(0, 0.01, (H, W)).astype(np.float32) * body
        mask[s] = body
    return mr, ct, mask


def write_sources(work: Path, patients: int, H: int, W: int, S: int) -> Tuple[Path, Path]:
    """The seed's file ((H, W, S), gzip) and the (S, H, W) / (1, H, W)-chunk raw file."""
    seed, shw = work / "synthrad.h5", work / "synthrad_shw.h5"
    rng = np.random.default_rng(0)
    with h5py.File(seed, "w") as a, h5py.File(shw, "w") as b:
        for p in range(patients):
            name = f"1PA{p + 1:03}"
            for g, v in zip(GROUPS, volume(rng, H, W, S)):
                a.create_dataset(f"{g}/{name}", data=np.ascontiguousarray(np.moveaxis(v, 0, -1)), compression="gzip")
                b.create_dataset(f"{g}/{name}", data=v, chunks=(1, H, W))
    return seed, shw


class SeedSlices(Dataset):
    """The seed's dataset_synthRAD_FLY (as given in the question), reading slices with h5py.

    layout "hws": datasets (H, W, S), slice = ds[..., k]; "shw": (S, H, W), slice = ds[k].
    aug: the seed's MONAI Compose([RandFlipd(prob=0.5, spatial_axis=[0, 1]),
    RandRotate90d(prob=0.5, spatial_axes=[0, 1])]) and torch.clamp(A/B, -1, 1).
    """

    def __init__(self, path: Path, layout: str, aug: bool) -> None:
        os.environ["HDF5_USE_FILE_LOCKING"] = "FALSE"
        self.path, self.layout, self.aug = str(path), layout, aug
        self.slice_info: List[Tuple[str, int]] = []
        with h5py.File(self.path, "r") as f:
            for key in f["MR"].keys():
                n = f["MR"][key].shape[-1 if layout == "hws" else 0]
                self.slice_info.extend((key, s) for s in range(n))
        self.aug_func = None
        if aug:
            from monai.transforms import Compose, RandFlipd, RandRotate90d

            self.aug_func = Compose([RandFlipd(keys=["A", "B", "M"], prob=0.5, spatial_axis=[0, 1]),
                                     RandRotate90d(keys=["A", "B", "M"], prob=0.5, spatial_axes=[0, 1])])
        self.h5file = None

    def __len__(self) -> int:
        return len(self.slice_info)

    def __getitem__(self, idx: int):
        if self.h5file is None:
            self.h5file = h5py.File(self.path, "r")
        key, s = self.slice_info[idx]
        f = self.h5file
        if self.layout == "hws":
            A, B, M = f["MR"][key][..., s], f["CT"][key][..., s], f["MASK"][key][..., s]
        else:
            A, B, M = f["MR"][key][s], f["CT"][key][s], f["MASK"][key][s]
        d = {"A": torch.from_numpy(A[None]), "B": torch.from_numpy(B[None]),
             "M": torch.from_numpy(M[None].astype(np.float32))}
        if self.aug_func is not None:
            d = self.aug_func(d)
        A, B, M = d["A"], d["B"], d["M"]
        if self.aug:
            A, B = torch.clamp(torch.as_tensor(A), -1, 1), torch.clamp(torch.as_tensor(B), -1, 1)
            M = torch.as_tensor(M)
        return A, B, M


def _plain(t: Any) -> torch.Tensor:
    return t.as_tensor() if hasattr(t, "as_tensor") else t


def seed_collate(batch):
    return tuple(torch.stack([_plain(item[k]) for item in batch]) for k in range(3))


def time_loader(ds: Dataset, workers: int, batch: int, seconds: float, collate: Callable) -> Tuple[int, float]:
    """Items per `seconds` of a shuffled DataLoader over `ds` (after one warm-up batch)."""
    g = torch.Generator()
    g.manual_seed(0)
    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=collate,
                        persistent_workers=workers > 0, generator=g, prefetch_factor=2 if workers else None)
    epoch = 0
    items, start = 0, None
    it = iter(loader)
    next(it)  # warm-up: workers started, files opened
    start = time.perf_counter()
    while True:
        for b in it:
            items += int(b[0].shape[0])
            if time.perf_counter() - start >= seconds:
                elapsed = time.perf_counter() - start
                del it, loader
                return items, elapsed
        epoch += 1
        if hasattr(ds, "set_epoch"):
            ds.set_epoch(epoch)
        it = iter(loader)


def time_getitems(ds: SliceDataset, batch: int, seconds: float) -> Tuple[int, float]:
    rng = np.random.default_rng(0)
    n = len(ds)
    ds.__getitems__(rng.integers(0, n, batch).tolist())  # warm-up
    items, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        out = ds.__getitems__(rng.integers(0, n, batch).tolist())
        slice_collate(out)
        items += batch
    return items, time.perf_counter() - start


def machine() -> str:
    """"2 cores, 24 GiB, Debian GNU/Linux 12 (bookworm), x86_64": what a result was measured on."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    name = platform.system()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {ram:.0f} GiB, {name}, {platform.machine()}"


def mask_rows(store: Path, batch: int, seconds: float, H: int) -> str:
    """The mask-aware section: items/s of __getitems__ and construction time, per mask rule."""
    crop = min(128, H)
    base = dict(context={"MR": 1}, crop=crop, flip=True, rot90=True, seed=0)
    rules = [("no mask rule", {}),
             ("require='MASK' (min_valid 1 voxel)", dict(require="MASK")),
             (f"require='MASK', min_valid=0.5 (half the {crop}x{crop} crop)", dict(require="MASK", min_valid=0.5)),
             ("require='MASK', min_valid=0.5, positive_fraction=0.8",
              dict(require="MASK", min_valid=0.5, positive_fraction=0.8))]
    lines = [
        f"### Mask-aware 2.5D items (MR context 1 + CT + MASK, {crop}x{crop} crops)",
        "",
        f"Measured {datetime.date.today().isoformat()} on {machine()}, files in the page cache. "
        f"`SliceDataset(store, (\"MR\", \"CT\", \"MASK\"), context={{\"MR\": 1}}, crop={crop}, "
        f"flip=True, rot90=True, ...)`, `__getitems__` with {batch} random indices (no workers), {seconds:.0f} s "
        f"per row; \"open\": building the dataset (with require: each mask volume read once to find the "
        f"slices that qualify).",
        "",
        "| mask rule | items | open (s) | items/s | vs no rule |",
        "|---|---:|---:|---:|---:|",
    ]
    ref = None
    for name, rule in rules:
        t = time.perf_counter()
        ds = SliceDataset(store, GROUPS, **base, **rule)
        opened = time.perf_counter() - t
        items, secs = time_getitems(ds, batch, seconds)
        rate = items / secs
        ref = ref or rate
        print(f"  {name:<60} {len(ds):>6} items, open {opened:.2f} s, {rate:>8.0f} items/s", flush=True)
        lines.append(f"| {name} | {len(ds):,} | {opened:.2f} | {rate:,.0f} | {rate / ref:.2f}x |")
    lines += [
        "",
        "Mask-aware crops draw candidate windows and count their mask voxels (the frames sampler's engine): "
        "the cost per item is a few candidate counts, more where few crops qualify. The synthetic body mask "
        "covers part of every slice, so every slice qualifies here; `open` is the cost of finding that out. "
        f"Measured while other jobs shared the machine (load average {os.getloadavg()[0]:.0f} at the end): "
        "rows vary by up to 2x between runs.",
    ]
    return "\n".join(lines) + "\n"


def write_section(out: Path, section: str) -> None:
    """Replaces the mask-aware section of `out` (or appends it), keeping the rest."""
    text = out.read_text() if out.exists() else ""
    text = re.sub(r"### Mask-aware 2\.5D items.*?(?=\n### |\Z)", "", text, flags=re.S).rstrip("\n")
    out.write_text((text + "\n\n" if text else "") + section)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patients", type=int, default=12)
    ap.add_argument("--size", type=int, default=256, help="H = W")
    ap.add_argument("--slices", type=int, default=96)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--seconds", type=float, default=5.0, help="timed seconds per configuration")
    ap.add_argument("--no-aug", action="store_true", help="skip the rows with augmentation")
    ap.add_argument("--mask-only", action="store_true", help="only the mask-aware rows (replaces their section)")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed at the end)")
    ap.add_argument("--out", default=str(HERE / "results" / "slices.md"), help="Markdown output ('' for none)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    H = W = args.size
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="patchstore-slices-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        seed_file, shw_file = work / "synthrad.h5", work / "synthrad_shw.h5"
        if not (seed_file.exists() and shw_file.exists()):
            write_sources(work, args.patients, H, W, args.slices)
        gen_s = time.perf_counter() - t
        store = work / "synthrad.ps"
        t = time.perf_counter()
        summary = patchstore.ingest_hdf5(seed_file, store, groups=GROUPS, masks=["MASK"], durable=False)
        ingest_s = time.perf_counter() - t
        mib = lambda p: p.stat().st_size / 2**20  # noqa: E731
        print(f"data: {args.patients} patients of {H}x{W}x{args.slices}, MR+CT float32 + MASK uint8; "
              f"(H,W,S) gzip {mib(seed_file):.0f} MiB, (S,H,W) raw {mib(shw_file):.0f} MiB, written in {gen_s:.0f} s")
        print(f"ingest_hdf5 of the gzip file: {summary.samples_written} new volumes in {ingest_s:.1f} s, "
              f"store {mib(store / 'data.mdb'):.0f} MiB (float32)")
        print(f"random slices, batches of {args.batch}, {args.seconds:.0f} s per row, {os.cpu_count()} cores\n",
              flush=True)

        if args.mask_only:
            section = mask_rows(store, args.batch, args.seconds, H)
            print()
            print(section)
            if args.out:
                write_section(Path(args.out), section)
                print(f"written to {args.out}")
            return

        rows: List[Tuple[str, str, str, int, float]] = []

        def row(name: str, layout: str, workers: str, items: int, secs: float) -> None:
            rows.append((name, layout, workers, items, secs))
            print(f"  {name:<52} {layout:<22} {workers:>7} {items / secs:>9.0f} slices/s", flush=True)

        lay_seed, lay_shw, lay_ps = "(H,W,S) gzip", "(S,H,W) (1,H,W) raw", "patchstore (S,H,W)"
        augs = [False] if args.no_aug else [False, True]
        for aug in augs:
            tag = " + MONAI aug + clamp" if aug else ""
            for w in args.workers:
                row("seed Dataset (h5py)" + tag, lay_seed, str(w),
                    *time_loader(SeedSlices(seed_file, "hws", aug), w, args.batch, args.seconds, seed_collate))
            for w in args.workers:
                row("seed Dataset (h5py)" + tag, lay_shw, str(w),
                    *time_loader(SeedSlices(shw_file, "shw", aug), w, args.batch, args.seconds, seed_collate))
            opts = dict(flip=True, rot90=True, clamp={"MR": (-1, 1), "CT": (-1, 1)}) if aug else {}
            tag = " flip+rot90+clamp" if aug else ""
            for w in args.workers:
                row("SliceDataset + DataLoader" + tag, lay_ps, str(w),
                    *time_loader(SliceDataset(store, GROUPS, **opts), w, args.batch, args.seconds, slice_collate))
            for threads in (1, 2):
                ds = SliceDataset(store, GROUPS, num_threads=threads, **opts)
                row(f"SliceDataset.__getitems__{tag}, {threads} thread{'s' if threads > 1 else ''}", lay_ps, "-",
                    *time_getitems(ds, args.batch, args.seconds))

        item_mb = (2 * 4 + 4) * H * W / 1e6  # MR + CT + MASK as float32
        base = {}
        for name, layout, w, items, secs in rows:
            if name.startswith("seed") and layout == lay_seed:
                base[(w, "aug" in name)] = items / secs
        lines = [
            f"### Python: random 2D slices of 3D volumes (MR+CT+MASK, {H}x{W})",
            "",
            f"`bench/python_slices_bench.py`: {args.patients} patients of {H}x{W}x{args.slices} in one HDF5 file "
            f"(the seed's layout: `(H,W,S)` gzip; and `(S,H,W)` with `(1,H,W)` chunks, uncompressed), "
            f"ingested once with `patchstore.ingest_hdf5` ({ingest_s:.1f} s). Shuffled DataLoader, batches of "
            f"{args.batch}; a slice = MR + CT + MASK, {item_mb:.2f} MB of float32; files in the page cache; "
            f"{os.cpu_count()} cores ({platform.machine()}), torch 1 thread per process. "
            f"\"vs seed\": against the seed's Dataset on its gzip file with as many workers "
            f"(with augmentation: against the seed's with its MONAI augmentation).",
            "",
            "| loader | source | workers | slices/s | MB/s | vs seed |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for name, layout, w, items, secs in rows:
            rate = items / secs
            ref = base.get((w if w != "-" else "0", "aug" in name or "flip" in name))
            lines.append(f"| {name} | {layout} | {w} | {rate:,.0f} | {rate * item_mb:,.0f} | "
                         f"{'' if ref is None else f'{rate / ref:.1f}x'} |")
        lines += [
            "",
            "The seed's gzip file is bound by decompression: h5py's chunks of an `(H,W,S)` dataset span many "
            "slices, so every slice read decompresses all the chunks that cross it. With DataLoader workers, "
            "each batch (here 25 MB) reaches the training process through a new shared-memory segment, as "
            "torch's own collate does; on a machine with few cores that costs more than the copy itself, so "
            "`num_workers=0` (or calling `__getitems__`) is the fastest way to run SliceDataset there. "
            "Figures on this shared 2-core machine vary by up to 2x between runs (threads most of all).",
        ]
        table = "\n".join(lines) + "\n"
        print()
        print(table)
        section = mask_rows(store, args.batch, args.seconds, H)
        print(section)
        if args.out:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(table + "\n" + section)
            print(f"written to {out}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
