# The same slices through DataLoader worker processes: for pipelines that add
# per-item Python work of their own. Slower for patchstore's reads (see the results).
import os

import patchstore
from patchstore.torch import SliceDataset, slice_collate
from torch.utils.data import DataLoader


def main():
    patchstore.ingest_hdf5("synthrad.h5", "synthrad.ps", groups=("MR", "CT", "MASK"),
                           norm={"MR": "range:0,3000", "CT": "range:-1024,3000"},
                           encoding="compact")
    ds = SliceDataset("synthrad.ps", fields=("MR", "CT", "MASK"), crop=256,
                      flip=True, rot90=True, clamp={"MR": (-1, 1), "CT": (-1, 1)})
    loader = DataLoader(ds, batch_sampler=ds.batch_sampler(32, shuffle=True),
                        num_workers=min(4, os.cpu_count()), persistent_workers=True,
                        collate_fn=slice_collate)
    for epoch in range(2):
        ds.set_epoch(epoch)      # reaches every worker, persistent or not
        for A, B, M in loader:
            ...
        print(epoch, len(ds), tuple(A.shape), tuple(B.shape), tuple(M.shape))


if __name__ == "__main__":
    main()
