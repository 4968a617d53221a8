"""patchstore: decode images once into float32 records in LMDB, read zero-copy patches from many processes.

Reading::

    import patchstore
    store = patchstore.open("frames.ps")
    sample = store["video03/0042"]          # {"rgb": (3,H,W), "mask": (1,H,W), "depth": (1,H,W)} float32, no copy
    patch = store.patch("video03/0042", "rgb", y, x, 256, 256)     # (3,256,256) view, no copy
    batch = store.read_patches(ids, "rgb", ys, xs, 256, 256, out=pinned)  # (N,3,256,256) gather, GIL released

Writing (same options as the ``patchstore`` command line)::

    patchstore.ingest_images("frames.ps", root="data",
                             fields={"rgb": "{video}/render/rgb/{frame}.png",
                                     "mask": "{video}/render/masks/{frame}.png",
                                     "depth": "{video}/render/depth/{frame}.exr"})
    patchstore.export("frames.ps", "out/", ids=["video03/0042"])

Training: :mod:`patchstore.torch` (``PatchDataset``, ``collate``).

Errors: KeyError (unknown id/field), IndexError (outside the data), ValueError
(bad argument), OSError (I/O; FileNotFoundError for a missing store),
:class:`CorruptRecordError` (an OSError subclass: stored bytes fail validation).
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

from ._store import CorruptRecordError, FieldInfo, Ids, Store, open
from ._ingest_api import ExportSummary, IngestSummary, export, ingest_images

__version__ = "0.1.0"

__all__ = [
    "open",
    "Store",
    "FieldInfo",
    "Ids",
    "CorruptRecordError",
    "ingest_images",
    "export",
    "IngestSummary",
    "ExportSummary",
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
