#!/usr/bin/env python3
"""NIfTI cohort ingest through ITK (`ingest_volumes`) against decode-only with SimpleITK, and
SliceDataset speed on the result.

Writes a SynthRAD-like synthetic cohort (default 20 patients, each MR and CT int16 and MASK uint8 of
512x512x150 voxels in .nii.gz, nibabel's gzip), then times in the same run:

  * decode only with SimpleITK: sitk.GetArrayFromImage(sitk.ReadImage(f)) for every file, in 1 and in
    2 processes (a multiprocessing pool): the floor of any loader that decodes these files;
  * patchstore.ingest_volumes into a store (--encoding compact: MR/CT int16, MASK uint8 as stored; and
    float32), 2 decoder processes: decode + conversion to (S,H,W) records + LMDB commit + fsync;
  * SliceDataset(fields=("MR", "CT", "MASK")).__getitems__ on the store: random axial slices, 32 per
    call (what a DataLoader's fetcher calls), items/s.

Run:  PYTHONPATH=bindings:build/bindings/python python bench/volumes_itk_bench.py [--patients N --size 512
      --slices 150]
Prints a Markdown table and writes it to bench/results/volumes_itk.md (--out). The generated data and
stores are deleted at the end (--keep keeps them).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

import nibabel as nib
import numpy as np
import SimpleITK as sitk

import patchstore
from patchstore.torch import SliceDataset

HERE = Path(__file__).resolve().parent


def volume(rng: np.random.Generator, n: int, s: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MR-, CT- and mask-like (i, j, k) = (n, n, s) volumes: a body ellipse with organs, mild noise."""
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float32)
    cy, cx = n / 2 + rng.uniform(-8, 8), n / 2 + rng.uniform(-8, 8)
    ry, rx = n * rng.uniform(0.30, 0.38), n * rng.uniform(0.38, 0.45)
    organs = [(rng.uniform(0.3, 0.7) * n, rng.uniform(0.3, 0.7) * n, rng.uniform(6, 40), rng.uniform(200, 1200))
              for _ in range(6)]
    mr = np.empty((n, n, s), np.int16)
    ct = np.empty((n, n, s), np.int16)
    mask = np.empty((n, n, s), np.uint8)
    for k in range(s):
        z = k / max(s - 1, 1) - 0.5
        body = ((yy - cy) / (ry * (1 - z * z))) ** 2 + ((xx - cx) / rx) ** 2 < 1
        m = np.where(body, 400 + 200 * np.sin(xx / 23 + z) * np.cos(yy / 31), 0)
        c = np.where(body, 40 + 30 * np.cos(xx / 41 - z), -1000)
        for oy, ox, r, v in organs:
            inside = body & (((yy - oy) ** 2 + (xx - ox) ** 2) < (r * (1 - abs(z))) ** 2)
            m[inside] = v
            c[inside] = v * 0.3 - 100
        mr[:, :, k] = (m + rng.normal(0, 20, (n, n)) * body).astype(np.int16).T
        ct[:, :, k] = (c + rng.normal(0, 10, (n, n)) * body).astype(np.int16).T
        mask[:, :, k] = body.T
    return mr, ct, mask


def write_cohort(root: Path, patients: int, n: int, s: int) -> List[Path]:
    rng = np.random.default_rng(0)
    aff = np.diag([0.9, 0.9, 2.5, 1.0])
    aff[:3, 3] = (-230.0, -230.0, -180.0)
    files = []
    for p in range(patients):
        d = root / f"1PA{p + 1:03d}"
        d.mkdir(parents=True)
        for name, arr in zip(("mr", "ct", "mask"), volume(rng, n, s)):
            img = nib.Nifti1Image(arr, aff)
            img.header.set_qform(aff, code=1)
            img.header.set_sform(aff, code=1)
            path = d / f"{name}.nii.gz"
            nib.save(img, str(path))
            files.append(path)
    return files


def decode(path: Path) -> int:
    return int(sitk.GetArrayFromImage(sitk.ReadImage(str(path))).nbytes)


def decode_all(files: List[Path], processes: int) -> Tuple[float, int]:
    """Seconds to decode every file (a pool's start-up and imports excluded)."""
    if processes == 1:
        t = time.perf_counter()
        nbytes = sum(decode(f) for f in files)
        return time.perf_counter() - t, nbytes
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(decode, files[:processes], chunksize=1)  # workers started, SimpleITK imported
        t = time.perf_counter()
        nbytes = sum(pool.map(decode, files, chunksize=1))
        return time.perf_counter() - t, nbytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patients", type=int, default=20)
    ap.add_argument("--size", type=int, default=512, help="H = W of each volume")
    ap.add_argument("--slices", type=int, default=150)
    ap.add_argument("--items-seconds", type=float, default=10.0)
    ap.add_argument("--work", default=None, help="folder for the generated data (default: a temporary one)")
    ap.add_argument("--out", default=str(HERE / "results" / "volumes_itk.md"))
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="ps-itk-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        t = time.perf_counter()
        files = write_cohort(work / "data", a.patients, a.size, a.slices)
        gen_s = time.perf_counter() - t
        gz_bytes = sum(f.stat().st_size for f in files)
        print(f"wrote {len(files)} files ({gz_bytes / 1e6:.0f} MB .nii.gz) in {gen_s:.0f} s", file=sys.stderr)
        raw = None
        for procs in (1, 2):
            secs, raw = decode_all(files, procs)
            rows.append((f"SimpleITK decode only (ReadImage + GetArrayFromImage), {procs} process"
                         + ("es" if procs > 1 else ""), secs))
        fields = {"MR": "{patient}/mr.nii.gz", "CT": "{patient}/ct.nii.gz", "MASK": "{patient}/mask.nii.gz"}
        stores = {}
        for enc in ("compact", "float32"):
            store = work / f"v-{enc}.ps"
            t = time.perf_counter()
            s = patchstore.ingest_volumes(store, root=work / "data", fields=fields, masks=["MASK"],
                                          encoding=enc, threads=2, progress=False)
            secs = time.perf_counter() - t
            assert s.samples_written == a.patients and s.samples_failed == 0
            size = sum(f.stat().st_size for f in store.iterdir())
            rows.append((f"patchstore.ingest_volumes --encoding {enc}, 2 decoder processes "
                         f"(store {size / 1e9:.2f} GB)", secs))
            stores[enc] = store
        ds = SliceDataset(stores["compact"], fields=("MR", "CT", "MASK"))
        rng = np.random.default_rng(1)
        ds.__getitems__(list(rng.integers(0, len(ds), 32)))  # warm-up
        n = 0
        t = time.perf_counter()
        while time.perf_counter() - t < a.items_seconds:
            ds.__getitems__(list(rng.integers(0, len(ds), 32)))
            n += 32
        items_s = n / (time.perf_counter() - t)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    vox = a.size * a.size * a.slices
    cpu = platform.processor() or platform.machine()
    lines = [
        f"### NIfTI cohort through ITK: ingest vs SimpleITK decode ({a.patients} patients, "
        f"{a.size}x{a.size}x{a.slices})",
        "",
        f"`bench/volumes_itk_bench.py --patients {a.patients} --size {a.size} --slices {a.slices}`, "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores ({cpu}), "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}, SimpleITK {sitk.Version_VersionString()}, "
        f"ITK 5.2 (Debian) in patchstore. Each patient: MR and CT int16 and MASK uint8, {vox / 1e6:.1f} M voxels "
        f"each, .nii.gz (nibabel's gzip): {len(files)} files, {gz_bytes / 1e6:.0f} MB compressed, "
        f"{raw / 1e6:.0f} MB decoded. Files in the page cache; the store on the same disk, fsync per commit.",
        "",
        "| what | seconds | volumes/s | decoded MB/s |",
        "|---|---:|---:|---:|",
    ]
    for what, secs in rows:
        lines.append(f"| {what} | {secs:.1f} | {3 * a.patients / secs:.2f} | {raw / secs / 1e6:.0f} |")
    lines += [
        "",
        f"SliceDataset(fields=(\"MR\", \"CT\", \"MASK\")).__getitems__ on the compact store, 32 random axial "
        f"slices per call, 1 thread: {items_s:,.0f} items/s ({items_s * 3 * a.size * a.size * 4 / 1e6:,.0f} "
        f"MB/s of float32).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
