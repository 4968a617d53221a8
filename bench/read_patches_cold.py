#!/usr/bin/env python3
"""Store.read_patches on a store evicted from the page cache.

    python bench/read_patches_cold.py STORE [--field rgb] [--windows 1000] [--size 256] [--repeats 3]

For each repeat: data.mdb is evicted (posix_fadvise(POSIX_FADV_DONTNEED),
what vmtouch -e does), then a fresh process opens the store and times one
Store.read_patches call of --windows windows at random ids and positions
(seeded, the same in every repeat and build), reporting seconds, windows/s
and the bytes the process read from the disk (/proc/self/io read_bytes).
Run it once per build (PYTHONPATH=<build>/bindings/python) to compare.
Prints one JSON line per repeat.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return -1


def child(args):
    import numpy as np

    import patchstore

    store = patchstore.open(args.store)
    rng = np.random.default_rng(args.seed)
    keys = rng.integers(0, len(store), args.windows)
    shapes = {int(k): store.shape(int(k), args.field) for k in set(keys.tolist())}
    ys = np.array([rng.integers(0, shapes[int(k)][1] - args.size + 1) for k in keys])
    xs = np.array([rng.integers(0, shapes[int(k)][2] - args.size + 1) for k in keys])
    out = np.empty((args.windows, shapes[int(keys[0])][0], args.size, args.size), np.float32)
    out.fill(0)  # fault the output in before timing
    b0, t0 = read_bytes(), time.perf_counter()
    store.read_patches(keys, args.field, ys, xs, args.size, args.size, out=out, num_threads=args.threads)
    dt, b1 = time.perf_counter() - t0, read_bytes()
    print(json.dumps({"windows": args.windows, "seconds": round(dt, 3), "windows_per_s": round(args.windows / dt, 1),
                      "read_MB": round((b1 - b0) / 1e6, 1), "checksum": float(out.sum(dtype=np.float64))}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--field", default="rgb")
    ap.add_argument("--windows", type=int, default=1000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    for _ in range(args.repeats):
        fd = os.open(os.path.join(args.store, "data.mdb"), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        cmd = [sys.executable, __file__, args.store, "--child", "--field", args.field, "--windows", str(args.windows),
               "--size", str(args.size), "--threads", str(args.threads), "--seed", str(args.seed)]
        sys.stdout.write(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
