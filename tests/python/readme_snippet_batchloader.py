# The fastest loop: whole batches gathered in C++ (GIL released) into a ring of
# reused, pinned buffers; no per-item Python work, no DataLoader workers.
# Run from the folder that holds data/{video}/render/{rgb,masks,depth}/.
import patchstore
import torch
from patchstore.torch import BatchLoader


def main():
    patchstore.ingest_images(  # once (resumes if interrupted, returns at once when done)
        "frames.ps", root="data",
        fields={"rgb": "{video}/render/rgb/{frame}.png",
                "mask": "{video}/render/masks/{frame}.png",
                "depth": "{video}/render/depth/{frame}.exr"})

    # 16 windows of 256x256 per batch: 4 frames x 4 patches, each holding a mask pixel.
    loader = BatchLoader("frames.ps", ["rgb", "mask", "depth"], patch_size=256, batch_size=16,
                         patches_per_sample=4, require="mask", seed=0,
                         num_threads=2, pin_memory=torch.cuda.is_available())

    for epoch in range(2):
        loader.set_epoch(epoch)  # optional: without it each pass takes the next epoch
        for batch in loader:     # {"rgb": (16,3,256,256), "mask": ..., "depth": ...} float32
            rgb = batch["rgb"]   # on a GPU: batch["rgb"].cuda(non_blocking=True)
            depth = torch.where(batch["mask"] > 0, batch["depth"], 0.0)  # not depth * mask: inf * 0 is NaN
            ...                  # the training step
        print(epoch, len(loader), tuple(rgb.shape), tuple(depth.shape))


if __name__ == "__main__":
    main()
