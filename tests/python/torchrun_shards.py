"""Run by test_shards.py under `torchrun --nproc-per-node=2`: each rank lists the samples it reads.

argv: SHARDS OUTDIR. Writes OUTDIR/<mode>-<epoch>-<rank>.txt, one sample id per line, for two
epochs in global mode (one store, the sampler splits by rank) and in rank-local mode.
"""

import os
import sys

import torch.distributed as dist

import patchstore

shards, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local = patchstore.RankLocalShards(shards, rank, world, seed=3)
for epoch in range(2):
    runs = {
        "global": patchstore.PatchSampler(patchstore.open(shards), ["rgb"], 8, patches_per_sample=1, seed=3,
                                          rank=rank, world_size=world),
        "local": patchstore.PatchSampler(local.open(epoch), ["rgb"], 8, patches_per_sample=1, seed=3),
    }
    for mode, sampler in runs.items():
        sampler.set_epoch(epoch)
        ids = []
        while len(ids) < len(sampler):  # read the windows' pixels, as training would
            w = sampler.batch(min(5, len(sampler) - len(ids)), return_windows=True)[1]
            ids += w.ids
        with open(os.path.join(out, f"{mode}-{epoch}-{rank}.txt"), "w") as f:
            f.write("\n".join(ids) + "\n")
    dist.barrier()
dist.destroy_process_group()
