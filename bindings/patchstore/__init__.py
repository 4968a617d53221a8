"""patchstore: decode images once into float32 records in LMDB, read zero-copy patches from many processes.

Reading:

```python
import patchstore
store = patchstore.open("frames.ps")
sample = store["video03/0042"]          # {"rgb": (3,H,W), "mask": (1,H,W), "depth": (1,H,W)} float32, no copy
patch = store.patch("video03/0042", "rgb", y, x, 256, 256)     # (3,256,256) view, no copy
batch = store.read_patches(ids, "rgb", ys, xs, 256, 256, out=pinned)  # (N,3,256,256) gather, GIL released
```

Writing (same options as the ``patchstore`` command line):

```python
patchstore.ingest_images("frames.ps", root="data",
                         fields={"rgb": "{video}/render/rgb/{frame}.png",
                                 "mask": "{video}/render/masks/{frame}.png",
                                 "depth": "{video}/render/depth/{frame}.exr"})
patchstore.export("frames.ps", "out/", ids=["video03/0042"])
patchstore.copy("frames.ps", "frames-tiles.ps", layout="tiles", encoding="compact")  # convert, no sources
```

Sampling (exact mask-aware windows, whole batches gathered in C++ with the GIL released):

```python
sampler = patchstore.PatchSampler("frames.ps", ["rgb", "mask", "depth"], patch_size=256,
                                  patches_per_sample=4, require="mask", num_threads=2)
batch = sampler.batch(64)               # {"rgb": (64,3,256,256), ...} float32, continues across epochs
sampler.last_windows                    # which sample, y, x, flip, rot each window came from
sheet = store.montage(64, 256, field="rgb", overlay="mask")   # (H,W,3) uint8 contact sheet
```

Volumes (3D MR/CT in HDF5, read as 2D slices):

```python
patchstore.ingest_hdf5("synthrad.h5", "synthrad.ps", groups=("MR", "CT", "MASK"))
store = patchstore.open("synthrad.ps")
vol = store.volume("patient001")                 # {"MR": (S,H,W), ...} float32, no copy
stack = store.slice("patient001", "MR", 17, context=2)   # (5,H,W); end slice repeated at the ends
store.slices[i]                                  # SliceRef(id, slice): flat slice i, O(1)
```

Training: `patchstore.torch` (``BatchLoader``, ``PatchDataset``, ``SliceDataset``, ``collate``).

Errors: KeyError (unknown id/field), IndexError (outside the data), ValueError
(bad argument), OSError (I/O; FileNotFoundError for a missing store),
`CorruptRecordError` (an OSError subclass: stored bytes fail validation).
"""

from __future__ import annotations

import os
import pkgutil
import shutil
from typing import Optional

# In the build tree the compiled modules (_patchstore, _ingest) are built into
# <build>/bindings/python/patchstore and this file stays in bindings/patchstore:
# with both folders on PYTHONPATH they form one package (no links to the .py
# files needed). Installed, every module is in the first folder, which is
# searched first, so a folder of the same name elsewhere on sys.path changes nothing.
__path__ = pkgutil.extend_path(__path__, __name__)

from ._config import SamplerConfig, SliceConfig
from ._copy_api import CopySummary, copy
from ._export_api import ExportSummary, export
from ._ingest_api import IngestSummary, ingest_hdf5, ingest_images
from ._ingest_volumes_api import ingest_volumes
from ._open import open
from ._patchstore import __version__  # VERSION at the source root, through the C++ build
from ._rank_local import RankLocalSampler, RankLocalShards
from ._sampler import PatchSampler, Window, Windows
from ._store import CorruptRecordError, FieldInfo, Ids, Store
from ._volumes import SliceIndex, SliceRef, SliceTransform, Volume

__all__ = [
    "open",
    "Store",
    "FieldInfo",
    "Ids",
    "Volume",
    "CorruptRecordError",
    "PatchSampler",
    "SamplerConfig",
    "SliceConfig",
    "Window",
    "Windows",
    "SliceIndex",
    "SliceRef",
    "SliceTransform",
    "RankLocalSampler",
    "RankLocalShards",
    "ingest_images",
    "ingest_hdf5",
    "ingest_volumes",
    "export",
    "copy",
    "IngestSummary",
    "ExportSummary",
    "CopySummary",
    "cli_path",
    "__version__",
]


def cli_path() -> Optional[str]:
    """The path of the ``patchstore`` command-line program, or None if not found.

    Looks in the installed package (patchstore/bin/patchstore), then at the
    PATCHSTORE_CLI environment variable, then on PATH.
    """
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "patchstore")
    for candidate in (here, os.environ.get("PATCHSTORE_CLI")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("patchstore")
