"""patchstore.torch: random patches (image stores) and slices (volume stores) for torch training.

Image stores: two ways in, both on the C++ sampler (patchstore::PatchSampler: exact
mask-aware uniform windows from the summed-area tables stored at ingest,
deterministic, gathered with the GIL released):

``BatchLoader`` -- ready (B, C, P, P) batches, no per-sample Python work,
reusing a small ring of (optionally pinned) buffers. The fastest path:
iterate it directly in the training process:

```python
from patchstore.torch import BatchLoader

loader = BatchLoader("frames.ps", ["rgb", "mask", "depth"], patch_size=256, batch_size=64,
                     patches_per_sample=4, require="mask", num_threads=2, pin_memory=True)
for epoch in range(epochs):
    loader.set_epoch(epoch)           # optional: without it each iter() takes the next epoch
    for batch in loader:              # batch["rgb"]: (64, 3, 256, 256) float32 in [-1, 1]
        rgb = batch["rgb"].cuda(non_blocking=True)
        ...
```

``PatchDataset`` -- a map-style Dataset (item i = k patches of sample i) for
code built around torch's DataLoader (slower than BatchLoader), batched by its
own resumable batch sampler (not ``shuffle=True``):

```python
from torch.utils.data import DataLoader
from patchstore.torch import PatchDataset, collate

train = PatchDataset("frames.ps", ["rgb", "mask", "depth"], patch_size=256,
                     patches_per_sample=4, require="mask")
loader = DataLoader(train, batch_sampler=train.batch_sampler(16, shuffle=True), num_workers=4,
                    pin_memory=True, persistent_workers=True, collate_fn=collate)
for epoch in range(epochs):
    train.set_epoch(epoch)            # before iterating: new positions each epoch
    for batch in loader:              # batch["rgb"]: (64, 3, 256, 256)
        ...
```

Volume stores (`patchstore.ingest_hdf5`): ``SliceDataset`` -- item i
is the tuple of fields of flat slice i, (2c+1, H, W) each, with an optional
random crop, flips and quarter turns done inside the one C++ copy; fastest
without workers (each batch one C++ copy per field in the training process):

```python
from patchstore.torch import SliceDataset, slice_collate

train = SliceDataset("synthrad.ps", ("MR", "CT", "MASK"), crop=256, flip=True, rot90=True,
                     clamp={"MR": (-1, 1), "CT": (-1, 1)})
loader = DataLoader(train, batch_sampler=train.batch_sampler(32, shuffle=True), collate_fn=slice_collate)
for epoch in range(epochs):
    train.set_epoch(epoch)
    for A, B, M in loader:            # (32, 1, 256, 256) each
        ...
```

Reproducibility: windows and slice transforms depend on (seed, epoch,
position) only, so a run yields the same items whatever num_workers,
num_threads, the start method (fork, spawn, forkserver) or
persistent_workers are.

Resuming mid-epoch: ``state_dict()`` / ``load_state_dict(state)`` on all
three (small dicts of ints and strings, saved with the model checkpoint):
after loading, the rest of the saved epoch and every later epoch are those
of the uninterrupted run. A BatchLoader iterated directly counts its
batches; map-style datasets resume through ``dataset.batch_sampler(...)``
(see `EpochBatchSampler`) with ``state_dict(batch=step)``; torchdata's
StatefulDataLoader works with all three as well.
"""

from .._resume import EpochBatchSampler
from ._collate import collate, slice_collate
from ._stored import FloatConverter, to_float
from .batch_loader import BatchLoader
from .patch_dataset import PatchDataset
from .slice_dataset import SliceDataset, _slice_transform_row  # noqa: F401  (_slice_transform_row: tests)

__all__ = ["BatchLoader", "EpochBatchSampler", "FloatConverter", "PatchDataset", "SliceDataset", "collate",
           "slice_collate", "to_float"]
