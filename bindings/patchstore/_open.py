"""patchstore.open: a store, or several read as one (a shard set)."""

from __future__ import annotations

import os
from typing import Sequence, Union

from ._store import Store


def open(path: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]], *,
         verify_checksums: bool = False, no_lock: bool = False) -> Store:
    """Opens the store at `path` read-only.

    `path` may also name several stores read as one (a shard set written by
    ``ingest_images(..., shard=(i, n))`` / ``--shard I/N``): a list of store
    paths, a directory holding them (and no store itself), or a glob
    (``"shards/frames-*.ps"``). Samples are numbered across the stores in
    shard order (shard 0's samples in its ingest order, then shard 1's, ...);
    ids, ``len``, ``info``, ``verify`` and every sampler and dataset work on
    the set as on one store. Errors: a missing or repeated shard, stores of
    two shard sets, different fields, or an id in two stores (naming both).

    verify_checksums: recompute each record's checksum on first access (one
    pass over the record; CorruptRecordError on mismatch).
    no_lock: read without LMDB's lock table even if the store is not sealed
    (sealed stores are always read that way).

    Raises FileNotFoundError when there is no store at `path`,
    CorruptRecordError when its metadata is damaged, OSError otherwise.
    """
    return Store(path, verify_checksums=verify_checksums, no_lock=no_lock)
