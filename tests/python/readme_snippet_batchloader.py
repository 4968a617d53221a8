# Training on random 256x256 patches of video frames (rgb PNG, mask PNG, depth EXR)
# with the fastest loop: whole batches gathered in C++ threads (GIL released) into a
# ring of reused, pinned buffers in the training process; no DataLoader workers.
# Run from the folder that holds data/{video}/render/{rgb,masks,depth}/.
import patchstore
import torch
from patchstore.torch import BatchLoader


def main():
    # Once: decode every frame (resumes if interrupted, returns at once when done).
    # tiles + compact: the layout for stores larger than RAM; fixed for the store's life.
    patchstore.ingest_images(
        "frames.ps", root="data", layout="tiles", encoding="compact",
        fields={"rgb": "{video}/render/rgb/{frame}.png",       # (3,H,W) x/255*2-1, in [-1,1]
                "mask": "{video}/render/masks/{frame}.png",    # (1,H,W) {0,1}
                "depth": "{video}/render/depth/{frame}.exr"})  # (1,H,W) float32, as stored

    # 16 windows per batch: 4 frames x 4 patches, each holding at least one mask pixel;
    # windows depend on (seed, epoch, position) only. num_threads: your cores.
    loader = BatchLoader("frames.ps", ["rgb", "mask", "depth"], patch_size=256, batch_size=16,
                         patches_per_sample=4, require="mask", seed=0,
                         num_threads=2, pin_memory=torch.cuda.is_available())

    for epoch in range(2):
        loader.set_epoch(epoch)  # optional: without it each pass takes the next epoch
        for batch in loader:     # {"rgb": (16,3,256,256), "mask": ..., "depth": ...} float32
            rgb = batch["rgb"]   # on a GPU: batch["rgb"].cuda(non_blocking=True)
            # Depth outside the mask set to 0; not depth * mask: depth keeps NaN/inf as rendered.
            depth = torch.where(batch["mask"] > 0, batch["depth"], 0.0)
            ...                  # the training step; loader.state_dict() resumes mid-epoch
        print(epoch, len(loader), tuple(rgb.shape), tuple(depth.shape))


if __name__ == "__main__":
    main()
