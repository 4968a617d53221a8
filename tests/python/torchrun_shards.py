"""Run by test_shards.py under `torchrun --nproc-per-node=2`: each rank lists the samples it reads.

argv: SHARDS OUTDIR. Writes OUTDIR/<mode>-<epoch>-<rank>.txt, one sample id per line, for two epochs in
global mode (one store, the sampler splits by rank), rank-local mode with shards dealt again each epoch
(assign="per_epoch", every shard reachable), and rank-local mode on node-local copies of each rank's own
shards (OUTDIR/node-<rank>, assign="fixed") with even="pad" and even="truncate": there the ranks' shards
hold different numbers of samples, the epoch length is agreed with all_reduce over the gloo group, and
every step does an all_reduce as DDP would (a rank with more steps would hang the job);
<mode>-<epoch>-<rank>.steps holds the steps run.
"""

import os
import sys

import torch
import torch.distributed as dist

import patchstore

shards, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local = patchstore.RankLocalShards(shards, rank, world, seed=3, assign="per_epoch")
node = patchstore.RankLocalShards(os.path.join(out, f"node-{rank}"), rank, world, seed=3)  # only its shards
even = {m: node.sampler(["rgb"], 8, even=m) for m in ("pad", "truncate")}


def write(mode, epoch, ids, steps=None):
    with open(os.path.join(out, f"{mode}-{epoch}-{rank}.txt"), "w") as f:
        f.write("\n".join(ids) + "\n")
    if steps is not None:
        with open(os.path.join(out, f"{mode}-{epoch}-{rank}.steps"), "w") as f:
            f.write(f"{steps} {len(even[mode])} {even[mode].own_windows}\n")


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
        write(mode, epoch, ids)
    for mode, sampler in even.items():
        sampler.set_epoch(epoch)
        ids, steps = [], 0
        for _ in range(len(sampler) // 4):  # the training loop: the same steps on every rank
            ids += sampler.batch(4, return_windows=True)[1].ids
            dist.all_reduce(torch.ones(1))  # the gradient all_reduce of a DDP step
            steps += 1
        if sampler.remaining:
            ids += sampler.batch(sampler.remaining, return_windows=True)[1].ids
            dist.all_reduce(torch.ones(1))
            steps += 1
        write(mode, epoch, ids, steps)
    dist.barrier()
dist.destroy_process_group()
