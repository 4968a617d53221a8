# The same windows through torch's DataLoader (PatchDataset, a map-style Dataset):
# for code built around a DataLoader. Slower than BatchLoader (see the results).
import os

import patchstore
import torch
from patchstore.torch import PatchDataset, collate
from torch.utils.data import DataLoader


def main():
    patchstore.ingest_images(
        "frames.ps", root="data", layout="tiles", encoding="compact",
        fields={"rgb": "{video}/render/rgb/{frame}.png",
                "mask": "{video}/render/masks/{frame}.png",
                "depth": "{video}/render/depth/{frame}.exr"})

    # Item i: 4 windows of frame i; positions depend on (seed, epoch, i), whatever num_workers is.
    ds = PatchDataset("frames.ps", ["rgb", "mask", "depth"], patch_size=256,
                      patches_per_sample=4, require="mask", seed=0)
    # The dataset's own batch sampler (not shuffle=True) makes ds.state_dict(batch=step) exact.
    loader = DataLoader(ds, batch_sampler=ds.batch_sampler(4, shuffle=True),
                        num_workers=min(4, os.cpu_count()), persistent_workers=True,
                        pin_memory=torch.cuda.is_available(),
                        collate_fn=collate)  # (4 frames * 4 patches, C, 256, 256)

    for epoch in range(2):
        ds.set_epoch(epoch)  # new positions each epoch, in every worker
        for batch in loader:
            rgb, mask = batch["rgb"], batch["mask"]  # (16,3,256,256), (16,1,256,256)
            depth = torch.where(mask > 0, batch["depth"], 0.0)
            ...                                      # the training step
        print(epoch, tuple(rgb.shape), tuple(mask.shape), tuple(depth.shape))


if __name__ == "__main__":
    main()
