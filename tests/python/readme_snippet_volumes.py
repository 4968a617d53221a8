# MR->CT synthesis on 2D slices of 3D volumes: one HDF5 file with groups MR, CT
# and MASK, one (H, W, slices) dataset per patient. patchstore replaces the
# Dataset that reads h5py slices (and decompresses gzip chunks) in every worker.
# Run from the folder that holds synthrad.h5.
import os

import patchstore
import torch
from patchstore.torch import SliceDataset, slice_collate
from torch.utils.data import DataLoader


def main():
    # Once: each (patient, group) becomes one float32 (S, H, W) record (resumes if interrupted).
    # MR (0..3000) and CT (-1024..3000 HU) are mapped linearly onto [-1, 1] (clamped outside);
    # MASK keeps its values. Same as: patchstore ingest hdf5 synthrad.h5 synthrad.ps
    #   --group MR --group CT --group MASK --norm MR=range:0,3000 --norm CT=range:-1024,3000
    patchstore.ingest_hdf5("synthrad.h5", "synthrad.ps", groups=("MR", "CT", "MASK"),
                           norm={"MR": "range:0,3000", "CT": "range:-1024,3000"})

    # dataset_synthRAD_FLY(aug=True, return_msk=True, rand_crop=True, crop_size=256):
    # item i = (A, B, M) of slice i, each (1, 256, 256). RandFlipd and RandRotate90d
    # (prob 0.5 each; flip=True turns by 180 degrees as RandFlipd(spatial_axis=[0, 1]) does,
    # flip="independent" flips rows and columns separately), the random crop and
    # torch.clamp(A/B, -1, 1) happen in the one copy out of the store, the same for A, B
    # and M; they depend on (seed, epoch, i). A clamp that cuts more than 1% of a batch warns.
    train_dataset = SliceDataset("synthrad.ps", fields=("MR", "CT", "MASK"), crop=256,
                                 flip=True, rot90=True, clamp={"MR": (-1, 1), "CT": (-1, 1)})
    train_data_loader = DataLoader(train_dataset, batch_size=32, shuffle=True,
                                   num_workers=min(4, os.cpu_count()),
                                   pin_memory=torch.cuda.is_available(), persistent_workers=True,
                                   collate_fn=slice_collate)  # the batch as gathered, no extra copy

    for epoch in range(2):
        train_dataset.set_epoch(epoch)  # new crops and flips each epoch, in every worker
        for A, B, M in train_data_loader:  # MR, CT, MASK: (32, 1, 256, 256) each
            ...                            # the training step
        print(epoch, len(train_dataset), tuple(A.shape), tuple(B.shape), tuple(M.shape))


if __name__ == "__main__":
    main()
