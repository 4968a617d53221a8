# MR->CT synthesis on 2D slices of 3D volumes: one HDF5 file with groups MR, CT and
# MASK, one (H, W, slices) dataset per patient. Batches are gathered in the training
# process (one C++ copy per field and batch), with no DataLoader workers.
# Run from the folder that holds synthrad.h5 (`python tools/make_volumes.py synthrad.h5` writes a small one).
import patchstore
from patchstore.torch import SliceDataset, slice_collate
from torch.utils.data import DataLoader


def main():
    # Once: each (patient, group) becomes one (S, H, W) record (resumes if interrupted).
    # MR (0..3000) and CT (-1024..3000 HU) map linearly onto [-1, 1], clamped outside;
    # MASK keeps its values. compact: stored in the source's type, read back as float32.
    patchstore.ingest_hdf5("synthrad.h5", "synthrad.ps", groups=("MR", "CT", "MASK"),
                           norm={"MR": "range:0,3000", "CT": "range:-1024,3000"},
                           encoding="compact")

    # Item i = (MR, CT, MASK) of slice i, each (1, 256, 256): random crop, flips and
    # quarter turns (as MONAI's RandFlipd/RandRotate90d, prob 0.5) and the clamp happen
    # in the one copy out of the store, the same for all three; they depend on (seed, epoch, i).
    ds = SliceDataset("synthrad.ps", fields=("MR", "CT", "MASK"), crop=256,
                      flip=True, rot90=True, clamp={"MR": (-1, 1), "CT": (-1, 1)})
    # num_workers=0: each batch is one __getitems__ call in this process, into reused buffers.
    loader = DataLoader(ds, batch_sampler=ds.batch_sampler(32, shuffle=True),
                        collate_fn=slice_collate)  # the batch as gathered, no extra copy

    for epoch in range(2):
        ds.set_epoch(epoch)      # new crops and flips each epoch
        for A, B, M in loader:   # MR, CT, MASK: (32, 1, 256, 256) each
            ...                  # the training step; ds.state_dict(batch=step) resumes mid-epoch
        print(epoch, len(ds), tuple(A.shape), tuple(B.shape), tuple(M.shape))


if __name__ == "__main__":
    main()
