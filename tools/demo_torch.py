#!/usr/bin/env python3
"""Demo step: read a frames store through PyTorch from several processes.

Prints patches/s for (a) PatchDataset in a DataLoader with 0 and 2 worker
processes and (b) whole-batch gathers in the training process
(patchstore.torch.BatchLoader when this build has it). 256x256 windows of
rgb+mask+depth holding at least one mask pixel, 4 per frame visit.
"""
import argparse
import time

import torch
from torch.utils.data import DataLoader

import patchstore
from patchstore.torch import PatchDataset, collate


def rate(loader, seconds):
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for batch in loader:
            n += batch["rgb"].shape[0]
            if time.perf_counter() - start >= seconds:
                break
    return n / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("store")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    store = patchstore.open(args.store)
    print(f"{args.store}: {len(store)} frames, fields {list(store.fields)}")
    ds = PatchDataset(args.store, ["rgb", "mask", "depth"], patch_size=256, patches_per_sample=4,
                      require="mask", seed=0)
    for workers in (0, 2):
        loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers, collate_fn=collate,
                            persistent_workers=workers > 0)
        rate(loader, 0.5)  # warm-up (workers start, pages come into cache)
        print(f"PatchDataset, DataLoader num_workers={workers}: {rate(loader, args.seconds):8.0f} patches/s")
    if hasattr(patchstore.torch, "BatchLoader"):
        bl = patchstore.torch.BatchLoader(args.store, ["rgb", "mask", "depth"], patch_size=256, batch_size=64,
                                          patches_per_sample=4, require="mask", num_threads=2)
        rate(bl, 0.5)
        print(f"BatchLoader in the training process, 2 threads: {rate(bl, args.seconds):8.0f} patches/s")


if __name__ == "__main__":
    main()
