# Training on random patches of video frames (rgb PNG, mask PNG, depth EXR),
# with patchstore instead of a Dataset that decodes three files per item.
# Run from the folder that holds data/{video}/render/{rgb,masks,depth}/.
import os

import patchstore
import torch
from patchstore.torch import PatchDataset, collate
from torch.utils.data import DataLoader


def main():
    # Once: decode every frame into float32 records (resumes if interrupted).
    # Same as: patchstore ingest images frames.ps --root data --field rgb=... --field mask=... --field depth=...
    patchstore.ingest_images(
        "frames.ps", root="data",
        fields={"rgb": "{video}/render/rgb/{frame}.png",       # (3,H,W) x/255*2-1, in [-1,1]
                "mask": "{video}/render/masks/{frame}.png",    # (1,H,W) {0,1}
                "depth": "{video}/render/depth/{frame}.exr"})  # (1,H,W) float32, as stored

    # 4 patches of 256x256 per frame, each holding at least one mask pixel;
    # positions depend on (seed, epoch, index) only, whatever num_workers is.
    train_dataset = PatchDataset("frames.ps", ["rgb", "mask", "depth"], patch_size=256,
                                 patches_per_sample=4, require="mask", seed=0)
    train_data_loader = DataLoader(train_dataset, batch_size=4, shuffle=True,
                                   num_workers=min(4, os.cpu_count()),
                                   pin_memory=torch.cuda.is_available(), persistent_workers=True,
                                   collate_fn=collate)  # (4 frames * 4 patches, C, 256, 256)

    for epoch in range(2):
        train_dataset.set_epoch(epoch)  # new positions each epoch, in every worker
        for batch in train_data_loader:
            rgb, mask = batch["rgb"], batch["mask"]  # (16,3,256,256), (16,1,256,256)
            # Depth outside the mask set to 0, as the old get_depth did. Not depth * mask:
            # depth keeps NaN/inf exactly as rendered, and inf * 0 is NaN.
            depth = torch.where(mask > 0, batch["depth"], 0.0)  # (16,1,256,256)
            ...                                      # the training step
        print(epoch, tuple(rgb.shape), tuple(mask.shape), tuple(depth.shape))


if __name__ == "__main__":
    main()
