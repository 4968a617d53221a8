#!/usr/bin/env python3
"""Batch prefetch on vs off, from a store evicted from the page cache (small and quick).

    PYTHONPATH=bindings:build/bindings/python python bench/scale/prefetch.py [--build build] [--work /tmp/ps-prefetch]
        [--frames 44] [--step-ms 50] [--batch 8] [--k 4] [--rounds 3]

Builds a store of --frames 1920x1080 rgb+mask+depth frames (4 generated frames listed under distinct
ids; 41.5 MB of float32 each, 44 frames = 1.8 GB), then for each round and mode (prefetch off / on,
alternating, a new seed per round) evicts data.mdb (posix_fadvise DONTNEED, as vmtouch -e) and reads one
epoch of random 256x256 windows (--k per visit) with require="mask" in batches of --batch, sleeping --step-ms
after each batch (a training
step: the time prefetch can overlap). Prints windows/s, the time spent waiting in batch() per batch,
and the bytes the disk read (/proc/diskstats) per window byte. Deletes the store unless --keep.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from run import disk_sectors_read, evict, make_sources  # noqa: E402


def epoch(store, prefetch, seed, batch, step_s, k):
    import patchstore

    s = patchstore.PatchSampler(store, ["rgb", "mask", "depth"], 256, require="mask", seed=seed, num_threads=2,
                                patches_per_sample=k, prefetch=prefetch)
    n = len(s)
    out = {f: __import__("numpy").empty(shape, "float32") for f, shape in s.shapes(batch).items()}
    d0, t0, waited, done = disk_sectors_read(), time.perf_counter(), 0.0, 0
    while done < n:
        k = min(batch, n - done)
        w0 = time.perf_counter()
        s.batch(k, out={f: a[:k] for f, a in out.items()})
        waited += time.perf_counter() - w0
        done += k
        time.sleep(step_s)
    secs = time.perf_counter() - t0
    window_bytes = done * 5 * 256 * 256 * 4
    return done / secs, waited / -(-n // batch), (disk_sectors_read() - d0) / window_bytes, secs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default="/tmp/ps-prefetch")
    ap.add_argument("--frames", type=int, default=44)
    ap.add_argument("--step-ms", type=float, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=4, help="patches per sample visit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    try:
        src, trip = make_sources(a.work, 1080, 1920, 2, 2, 1)
        store = os.path.join(a.work, "frames.ps")
        if not os.path.isdir(store):
            manifest = os.path.join(src, "m.csv")
            with open(manifest, "w") as f:
                f.write("id,rgb,mask,depth\n")
                for i in range(a.frames):
                    r, m, d = trip[i % len(trip)]
                    f.write(f"s{i:06d},{r},{m},{d}\n")
            subprocess.run([os.path.join(a.build, "patchstore"), "--quiet", "ingest", "images", store, "--manifest",
                            manifest, "--no-sync"], check=True, stdout=subprocess.DEVNULL)
            os.sync()
        print(f"{a.frames} frames of 1920x1080 rgb+mask+depth, k={a.k}, {a.batch}-window batches of 256x256 "
              "rgb+mask+depth "
              f"(require='mask', num_threads=2), {a.step_ms:g} ms step after each batch, one epoch per run from "
              f"an evicted store")
        print("| prefetch | round | windows/s | wait in batch() per batch | disk bytes / window bytes |")
        print("|---|---:|---:|---:|---:|")
        for r in range(a.rounds):
            for prefetch in (False, True):
                evict(store)
                wps, wait, amp, secs = epoch(store, prefetch, 100 + r, a.batch, a.step_ms / 1000, a.k)
                print(f"| {'on' if prefetch else 'off'} | {r} | {wps:.1f} | {wait * 1000:.0f} ms | {amp:.2f} |",
                      flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
