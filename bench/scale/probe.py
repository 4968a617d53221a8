#!/usr/bin/env python3
"""One measured operation on a store, run in a fresh process by bench/scale/run.py.

    python bench/scale/probe.py OP STORE [--fields rgb,mask,depth] [--patch 256]

Prints one JSON line: {"op", "seconds"} where seconds covers the operation
itself (after `import patchstore`, which is the same for every store). The
caller counts the bytes this process read from storage (getrusage of its
children: ru_inblock, i.e. /proc/<pid>/io read_bytes).
Ops: open (patchstore.open + len + ids), sampler (open + PatchSampler with
require="mask"), first_batch (sampler + one batch of 16 windows),
dataloader (PatchDataset + torch DataLoader, 2 workers, to its first batch).
"""
import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", choices=["open", "sampler", "first_batch", "dataloader"])
    ap.add_argument("store")
    ap.add_argument("--fields", default="rgb,mask,depth")
    ap.add_argument("--patch", type=int, default=256)
    a = ap.parse_args()
    fields = a.fields.split(",")
    import patchstore
    if a.op == "dataloader":
        import torch  # noqa: F401  (import cost outside the timed part)
        from torch.utils.data import DataLoader

        from patchstore.torch import PatchDataset, collate
    t0 = time.perf_counter()
    if a.op == "open":
        s = patchstore.open(a.store)
        n = len(s)
        ids = s.ids
        assert len(ids) == n
    elif a.op in ("sampler", "first_batch"):
        sp = patchstore.PatchSampler(a.store, fields, a.patch, patches_per_sample=4, require="mask", seed=0)
        if a.op == "first_batch":
            b = sp.batch(16)
            assert b[fields[0]].shape[0] == 16
    else:
        ds = PatchDataset(a.store, fields, a.patch, patches_per_sample=4, require="mask", seed=0)
        dl = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=collate)
        batch = next(iter(dl))
        assert batch[fields[0]].shape[0] == 16
        del dl
    print(json.dumps({"op": a.op, "seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
