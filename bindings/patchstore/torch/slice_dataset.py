"""patchstore.torch.SliceDataset: 2D slices (or 2.5D stacks) of the volumes of a volume store."""

from __future__ import annotations

import operator
import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from .. import _patchstore as _C
from .._resume import ResumableDataset
from .._sampler_options import _position
from .._shared import _SharedEpoch
from .._store import Store, reader_of
from .._volumes import SliceIndex, SliceRef, SliceTransform, draw_transforms
from ._common import _batch_tensor, _clamps, _empty
from ._stored import check_output, stored_dtypes


def _flip_mode(flip: Union[bool, str]) -> str:
    """SliceDataset's flip option as the C++ binding spells it: '', 'both' or 'independent'."""
    return "independent" if flip == "independent" else ("both" if flip else "")


def _slice_transform_row(seed: int, epoch: int, i: int, H: int, W: int, crop: Optional[Tuple[int, int]],
                         flip: Union[bool, str], rot90: bool) -> List[int]:
    """draw_transforms(seed, epoch, [i], [H], [W], crop, flip, rot90)[0] for one item, as Python ints.

    Drawn in C++ (patchstore::DrawSliceTransform, the one counter-based generator of reader/transform.h).
    """
    ch, cw = crop if crop is not None else (0, 0)
    return list(_C.draw_slice_transform(seed, epoch, i, H, W, ch, cw, _flip_mode(flip), bool(rot90)))


class SliceDataset(ResumableDataset, Dataset[Tuple[torch.Tensor, ...]]):
    """2D slices (or 2.5D stacks) of the volumes of a volume store, as a map-style Dataset.

    The replacement of a Dataset that reads ``h5["MR"][patient][..., k]``
    with h5py in every worker: the volumes are ingested once
    (:func:`patchstore.ingest_hdf5`) as float32 (S, H, W) records, so slice
    k of every field is a contiguous block of the store's memory map.

    ``len(dataset)``: the number of slices over all volumes (or over `ids`,
    a train/validation split, in that order). Item i is the TUPLE of
    `fields` for flat slice i (``dataset.ref(i)`` says which volume and
    slice, see :class:`patchstore.SliceIndex`), each a float32 tensor
    (2*context+1, H, W): slices k-context .. k+context, the end slice
    repeated where the stack crosses an end of the volume. With `crop` each
    is (2*context+1, h, w) (h = w = crop, or crop = (h, w)), cut at a random
    position, the same one in every field.

    Augmentation (as MONAI's RandFlipd / RandRotate90d), the same for every field of
    an item and for every slice of its stack:

    * ``flip=True``: with probability 1/2 flip both spatial axes, as
      ``RandFlipd(prob=0.5, spatial_axis=[0, 1])`` does (which is a 180
      degree turn); ``flip="independent"``: flip the rows and the columns
      each with probability 1/2 (all four mirror images equally likely).
    * ``rot90=True``: with probability 1/2 turn by k quarter turns, k
      uniform in {1, 2, 3}, as ``RandRotate90d(prob=0.5, max_k=3)``
      (``np.rot90(a, k, axes=(-2, -1))``). Odd turns swap height and width,
      so rot90 needs square output planes (a square crop or square slices).
    * ``clamp=(lo, hi)``: values clipped to [lo, hi] (as
      ``torch.clamp(A, -1, 1)``), or ``{field: (lo, hi)}`` for some fields
      only, e.g. ``{"MR": (-1, 1), "CT": (-1, 1)}`` to leave a mask alone.
      Values are clamped in the units they were STORED in: a CT ingested
      without normalisation keeps its HU, and clamping that to [-1, 1]
      destroys it; ingest with ``norm={"CT": "range:-1024,3000"}``. A clamp
      that cuts more than ``clamp_warn`` (default 0.01) of a batch's values
      of a field (counted before clamping, on up to 65,536 evenly strided
      values) warns once per field and process, naming the field and the
      fraction; ``clamp_warn=None`` silences it.

    Crop, flips and rotation are applied by the C++ copy out of the map
    (patchstore::CopySliceStacks with a patchstore::SliceTransform): one
    copy per field, no intermediate array. Clamping runs in place on the
    copied batch. ``dataset.transform(i)`` gives item i's
    :class:`patchstore.SliceTransform`, whose ``apply`` does the same with
    NumPy on ``store.slice(...)``.

    Reproducibility: the transform of item i is a pure function of (seed,
    epoch, i): SplitMix64 hashes, as the C++ patch sampler uses (see
    ``patchstore._volumes.draw_transforms``), so items do not depend on
    num_workers, the batch split, the worker start method or
    persistent_workers. Call ``set_epoch(e)`` before iterating epoch e: the
    epoch lives in shared memory and reaches the workers, persistent or not.

    Batches: DataLoader fetches a batch through ``__getitems__``, which
    copies all B stacks of each field with one C++ call (GIL released,
    ``num_threads`` threads) into one (B, 2c+1, h, w) tensor per field, in
    shared memory inside a worker; items are views of it, and
    :func:`slice_collate` (or :func:`collate`) passes those tensors through
    as the batch without another copy::

        ds = SliceDataset("synthrad.ps", ("MR", "CT", "MASK"), crop=256, flip=True, rot90=True)
        loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=4, collate_fn=slice_collate)
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            for A, B, M in loader:        # (32, 1, 256, 256) each
                ...

    In the training process (no workers), the batch tensors come from a
    small pool of buffers that are reused once nothing refers to a previous
    batch any more (never while the batch, an item, a view or a NumPy array
    of it is alive), so batch 32 or 64 of 2.5D stacks (40+ MB per field)
    costs no fresh memory mapping per batch; about two batches' worth of
    buffers stay allocated.

    output: "float32" (the default) or "stored": items hold each field in
    its stored dtype (int16/uint16 source values of a compact store,
    float16, float32), unclamped; :func:`patchstore.torch.to_float`
    (``to_float(batch, dataset, device=...)``) gives the float32 items bit
    for bit, with this dataset's clamp applied.

    ids: a list (or other sequence) of volume ids, in that order; a single
    string is a TypeError and an empty list a ValueError. A volume that
    gives no item (no slice, or slices smaller than ``crop``) is left out,
    as the window loaders skip a sample without a qualifying window:
    counted (``skipped``, ``skipped_ids``), warned about once here, never
    replaced by a neighbour; ValueError when none is left. Volumes whose
    slices differ in size need ``crop`` to be batched (warned here;
    :func:`slice_collate` says so when a batch mixes them).

    Processes: pickles as the store path and the options (fork, spawn and
    forkserver workers); each process reopens the store and rebuilds the
    slice index (one header read per record).

    Errors: KeyError for an unknown field or id, ValueError for bad options,
    a store of images (kind "frames"), a crop larger than every volume's slices
    or rot90 with non-square planes; IndexError for an index outside
    [-len, len).
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Store],
        fields: Union[str, Sequence[str]] = ("MR", "CT"),
        context: int = 0,
        crop: Union[None, int, Tuple[int, int]] = None,
        flip: Union[bool, str] = False,
        rot90: bool = False,
        seed: int = 0,
        *,
        clamp: Any = None,
        ids: Optional[Sequence[Union[str, bytes, int]]] = None,
        num_threads: int = 1,
        verify_checksums: bool = False,
        clamp_warn: Optional[float] = 0.01,
        output: str = "float32",
    ) -> None:
        super().__init__()
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"SliceDataset: ids must be a list of volume ids, not the single string {ids!r} "
                            f"(did you mean ids=[{ids!r}]?)")
        if ids is not None:
            ids = list(ids)
            if not ids:
                raise ValueError("SliceDataset: ids=[] selects no volume (the dataset would be empty); "
                                 "give ids=None for all volumes")
        self.store = path if isinstance(path, Store) else Store(path, verify_checksums=verify_checksums)
        self.fields: Tuple[str, ...] = (fields,) if isinstance(fields, str) else tuple(fields)
        if not self.fields:
            raise ValueError("SliceDataset needs at least one field")
        if len(set(self.fields)) != len(self.fields):
            raise ValueError(f"SliceDataset: fields {list(self.fields)} name a field twice")
        known = self.store.fields
        for f in self.fields:
            if f not in known:
                raise KeyError(f"no field '{f}' in '{self.store.path}' (fields: {', '.join(known)})")
        if self.store.kind != "volumes":
            raise ValueError(f"SliceDataset reads volume stores (written by patchstore.ingest_hdf5); "
                             f"'{self.store.path}' holds {self.store.kind}")
        self.context = operator.index(context)
        if self.context < 0:
            raise ValueError(f"SliceDataset: context must be >= 0, got {context!r}")
        if crop is None:
            self.crop: Optional[Tuple[int, int]] = None
        elif isinstance(crop, int):
            self.crop = (operator.index(crop), operator.index(crop))
        else:
            ch, cw = crop
            self.crop = (operator.index(ch), operator.index(cw))
        if self.crop is not None and min(self.crop) < 1:
            raise ValueError(f"SliceDataset: crop must be positive, got {crop!r}")
        if flip not in (False, True, "independent"):
            raise ValueError(f"SliceDataset: flip must be False, True or 'independent', got {flip!r}")
        self.flip = flip
        self.rot90 = bool(rot90)
        self.seed = operator.index(seed)
        if not 0 <= self.seed < 2 ** 64:
            raise ValueError(f"SliceDataset: seed must be in [0, 2**64), got {seed!r}")
        self.clamp = _clamps(clamp, self.fields)
        if clamp_warn is not None and not 0 <= float(clamp_warn) <= 1:
            raise ValueError(f"SliceDataset: clamp_warn must be a fraction in [0, 1] or None, got {clamp_warn!r}")
        self.clamp_warn = None if clamp_warn is None else float(clamp_warn)
        self.output = check_output(output, "SliceDataset")
        # Per field: the dtype items hold (stored dtypes for output="stored", whose clamp to_float applies).
        self._dtypes = (stored_dtypes(self.store, self.fields) if self.output == "stored"
                        else {f: torch.float32 for f in self.fields})
        self._saturated: Dict[str, float] = {}  # fields already warned about in this process
        t = operator.index(num_threads)
        self.num_threads = (os.cpu_count() or 1) if t == 0 else t
        if self.num_threads < 1:
            raise ValueError(f"SliceDataset: num_threads must be >= 1 (or 0 for all cores), got {num_threads!r}")
        self.index: SliceIndex = self.store.slice_index(ids)  # ValueError here for bad volumes
        self.skipped_ids: List[str] = []
        self._skip_unusable()
        self._check_shapes()
        self._epoch = _SharedEpoch(0)

    def _check_saturation(self, field: str, t: torch.Tensor, lo: float, hi: float) -> None:
        """Warns once per field and process when `clamp` cuts more than clamp_warn of a batch's values.

        Counted before clamping, on at most 65,536 evenly strided values of
        the batch (all of them in a batch that small).
        """
        if self.clamp_warn is None or field in self._saturated or t.numel() == 0:
            return
        flat = t.view(-1)
        step = max(1, flat.numel() >> 16)
        sample = flat[::step]
        frac = float(torch.count_nonzero((sample < lo) | (sample > hi))) / sample.numel()
        if frac <= self.clamp_warn:
            return
        self._saturated[field] = frac
        info = self.store.fields[field]
        warnings.warn(
            f"patchstore.torch.SliceDataset: clamp ({lo:g}, {hi:g}) on field '{field}' of '{self.store.path}' "
            f"saturated {100 * frac:.2f}% of a batch's values (more than clamp_warn={self.clamp_warn:g}): the "
            f"stored values are not in [{lo:g}, {hi:g}] (stored normalisation: {info.norm}). Normalise at ingest, "
            f"e.g. --norm {field}=range:LO,HI (norm={{'{field}': 'range:-1024,3000'}} for CT in HU), or drop "
            f"the clamp for this field. Warned once per field and process.",
            RuntimeWarning, stacklevel=4)

    @property
    def skipped(self) -> int:
        """How many volumes were left out because they give no item (no slice, or slices smaller than crop)."""
        return len(self.skipped_ids)

    def _skip_unusable(self) -> None:
        """Leaves out volumes with no slice or with slices smaller than `crop`: counted, warned once.

        As the window loaders treat a sample without a qualifying window: the
        volume is skipped (``skipped``, ``skipped_ids``), never replaced by a
        neighbour, and reported once here; ValueError when no volume is left.
        """
        keep, skipped, why = self.index.select_giving_items(self.crop)
        self.skipped_ids.extend(skipped)
        if not skipped:
            return
        if not keep:
            raise ValueError(f"SliceDataset: no volume of '{self.store.path}' gives an item"
                             + (f": crop {self.crop[0]}x{self.crop[1]} is larger than the slices of every volume"
                                if self.crop is not None else "") + f" ({why})")
        self.index = self.store.slice_index(keep)
        warnings.warn(f"patchstore.torch.SliceDataset: {len(skipped)} of {len(skipped) + len(keep)} volumes of "
                      f"'{self.store.path}' give no item and are skipped"
                      + (f" (crop {self.crop[0]}x{self.crop[1]})" if self.crop is not None else "")
                      + f": {why}. dataset.skipped_ids lists them.",
                      RuntimeWarning, stacklevel=3)

    def _check_shapes(self) -> None:
        ix = self.index
        square = True
        sizes: Dict[Tuple[int, int], int] = {}
        for v in range(ix.volume_count):
            _, H, W = ix.shape(v)
            sizes.setdefault((H, W), v)
            if self.crop is not None and (self.crop[0] > H or self.crop[1] > W):
                raise ValueError(f"SliceDataset: crop {self.crop[0]}x{self.crop[1]} is larger than the {H}x{W} "
                                 f"slices of volume '{self.store.ids[ix.sample(v)]}' in '{self.store.path}'")
            square = square and H == W
        if self.rot90:
            if self.crop is not None and self.crop[0] != self.crop[1]:
                raise ValueError(f"SliceDataset: rot90 needs a square crop (odd turns swap height and width), "
                                 f"got {self.crop[0]}x{self.crop[1]}")
            if self.crop is None and not square:
                raise ValueError("SliceDataset: rot90 needs square slices or a square crop (odd turns swap height "
                                 f"and width); '{self.store.path}' has non-square slices")
        if self.crop is None and len(sizes) > 1:
            shown = ", ".join(f"{h}x{w} ('{self.store.ids[ix.sample(v)]}')" for (h, w), v in list(sizes.items())[:4])
            warnings.warn(f"patchstore.torch.SliceDataset: the volumes of '{self.store.path}' have slices of "
                          f"{len(sizes)} sizes ({shown}{', ...' if len(sizes) > 4 else ''}) and no crop is given: "
                          f"a batch that mixes them cannot be stacked. Give crop=(h, w) (at most the smallest "
                          f"slice), or batch volumes of one size.", RuntimeWarning, stacklevel=3)

    # -- epochs ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Selects the transforms of epoch `epoch` (>= 0), here and in DataLoader workers."""
        e = _position(epoch, "epoch")
        self._epoch.value = e

    # -- description --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.index)

    @property
    def options(self) -> Dict[str, Any]:
        """The options it was built with (ids: the volumes it reads, in order, after skipping those that
        give no item); what state_dict() records, less num_threads and clamp_warn."""
        return {"fields": self.fields, "context": self.context, "crop": self.crop, "flip": self.flip,
                "rot90": self.rot90, "seed": self.seed, "clamp": dict(self.clamp), "ids": self.index.volumes,
                "num_threads": self.num_threads, "clamp_warn": self.clamp_warn}

    def __repr__(self) -> str:
        return (f"SliceDataset('{self.store.path}', fields={list(self.fields)}, context={self.context}, "
                f"crop={self.crop}, flip={self.flip!r}, rot90={self.rot90}, seed={self.seed}, "
                f"epoch={self.epoch}, slices={len(self)}, volumes={self.index.volume_count})")

    def _normalise(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.fromiter((operator.index(i) for i in indices), dtype=np.int64, count=len(indices))
        n = len(self.index)
        idx[idx < 0] += n
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise IndexError(f"SliceDataset index {int(np.asarray(indices)[np.argmax(bad)])} out of range "
                             f"[0, {n}) for '{self.store.path}'")
        return idx

    def _locality_items(self) -> Tuple[np.ndarray, np.ndarray]:
        """Items in storage order (by sample index, then slice) and the bytes each adds to a block: one
        (H, W) plane of every field (a run of neighbouring slices reads each plane once; the context
        planes it shares with its neighbours are not counted again). For batch_sampler(order="locality")."""
        rows = self.index._lookup(np.arange(len(self.index), dtype=np.int64))
        items = np.lexsort((rows[:, 1], rows[:, 0])).astype(np.int64)
        plane = rows[items, 3] * rows[items, 4] * 4 * len(self.fields)
        return items, plane.astype(np.uint64)

    def ref(self, i: int) -> SliceRef:
        """(volume id, slice) of item i."""
        return self.index[i]

    def _plan(self, idx: np.ndarray, epoch: Optional[int]) -> Tuple[np.ndarray, np.ndarray]:
        """(rows (n, 5): sample, slice, depth, H, W; transforms (n, 7)) of normalised indices."""
        rows = self.index._lookup(idx)
        e = self.epoch if epoch is None else _position(epoch, "epoch")
        tr = draw_transforms(self.seed, e, idx, rows[:, 3], rows[:, 4], self.crop, self.flip, self.rot90)
        return rows, tr

    def transform(self, i: int, epoch: Optional[int] = None) -> SliceTransform:
        """The crop, flips and rotation of item i in `epoch` (default: the current one).

        ``dataset[i][f]`` equals ``dataset.transform(i).apply(store.slice(id, f, k, context))`` with
        ``(id, k) = dataset.ref(i)`` (then clamped).
        """
        idx = self._normalise([i])
        return SliceTransform.from_row(self._plan(idx, epoch)[1][0])

    # -- items ------------------------------------------------------------------------

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, ...]:
        """Item i alone: the same values as ``__getitems__([i])[0]``, on a path cut to the copy itself.

        What DataLoader with batch_size=None or a per-item sampler calls, and what a loop over the
        dataset calls: one C++ call for the lookup and the draw (SliceIndex.draw_item), no NumPy round
        trips, and one C++ copy per item (see bench/python_item_bench.py).
        """
        self._check_resume()
        h_ = self._handles()
        ix, n, reader, fields, depth, ch, cw, mode, augments = h_[1:]
        j = operator.index(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"SliceDataset index {i} out of range [0, {n}) for '{self.store.path}'")
        sample, k, h, w, row = ix.draw_item(self.seed, self.epoch, j, ch, cw, mode, self.rot90)
        refs = np.array([[sample, k]], dtype=np.int64)  # per call: threads may share ds
        tr = np.array([row], dtype=np.int64) if augments else None
        nf = len(fields)
        if self.output == "stored":  # one tensor per field: their dtypes may differ
            out = tuple(_empty((depth, h, w), torch.utils.data.get_worker_info() is not None, self._dtypes[f])
                        for f in self.fields)
            _C.copy_slice_stacks(reader, refs, tr, fields, self.context, [t.numpy()[None] for t in out], 1)
            return out  # unclamped: to_float applies the clamp
        if torch.utils.data.get_worker_info() is None:
            # One allocation for all fields; the items are views of it (as __getitems__'s are of the batch).
            buf = np.empty((nf, 1, depth, h, w), dtype=np.float32)
            _C.copy_slice_stacks(reader, refs, tr, fields, self.context, list(buf), 1)
            out = torch.from_numpy(buf.reshape(nf, depth, h, w)).unbind(0)
        else:  # in shared memory, which the worker hands to the training process without a copy
            out = tuple(_empty((depth, h, w), True) for _ in fields)
            _C.copy_slice_stacks(reader, refs, tr, fields, self.context, [t.numpy()[None] for t in out], 1)
        for f, t in zip(self.fields, out):
            c = self.clamp.get(f)
            if c is not None:
                t.clamp_(c[0], c[1])
        return out

    def _handles(self) -> Tuple[Any, ...]:
        """(pid, native index, len, reader, fields, depth, crop_h, crop_w, flip mode, augments) of this process.

        Handles and options only, cached per process; the lookup and the draw are C++ (draw_item).
        """
        h = getattr(self, "_handle_cache", None)
        if h is None or h[0] != os.getpid():
            ix = self.index._n()
            ch, cw = self.crop if self.crop is not None else (0, 0)
            augments = self.crop is not None or bool(self.flip) or self.rot90
            h = (os.getpid(), ix, len(ix), reader_of(self.store), list(self.fields), 2 * self.context + 1, ch, cw,
                 _flip_mode(self.flip), augments)
            self._handle_cache = h
        return h

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_pool", None)  # batch buffers belong to the process that made them
        state.pop("_handle_cache", None)  # per process
        return state

    def __getitems__(self, indices: Sequence[int]) -> List[Tuple[torch.Tensor, ...]]:
        """Items for a whole batch of indices (used by DataLoader's fetcher): one C++ copy per field."""
        self._check_resume()
        indices = list(indices)
        idx = self._normalise(indices)
        n = idx.shape[0]
        if n == 0:
            return []
        rows, tr = self._plan(idx, None)
        # Output plane per item: the crop (or the slice), swapped by odd turns.
        oh = tr[:, 2].copy() if self.crop is not None else rows[:, 3].copy()
        ow = tr[:, 3].copy() if self.crop is not None else rows[:, 4].copy()
        odd = (tr[:, 6] % 2) == 1
        oh[odd], ow[odd] = ow[odd], oh[odd]
        shared = torch.utils.data.get_worker_info() is not None
        reader = reader_of(self.store)
        depth = 2 * self.context + 1
        items: List[Optional[Tuple[torch.Tensor, ...]]] = [None] * n
        shapes = np.stack([oh, ow], axis=1)
        groups = [np.arange(n)] if (shapes == shapes[0]).all() else [
            np.flatnonzero((shapes == s).all(axis=1)) for s in np.unique(shapes, axis=0)]
        for g in groups:
            h, w = int(oh[g[0]]), int(ow[g[0]])
            batch = [_batch_tensor(self, (len(g), depth, h, w), shared, len(self.fields), self._dtypes[f])
                     for f in self.fields]
            refs = np.ascontiguousarray(rows[g][:, :2])
            _C.copy_slice_stacks(reader, refs, np.ascontiguousarray(tr[g]), list(self.fields), self.context,
                                 [t.numpy() for t in batch], self.num_threads)
            for f, t in zip(self.fields, batch):
                if f in self.clamp and self.output == "float32":  # stored items: to_float clamps
                    lo, hi = self.clamp[f]
                    self._check_saturation(f, t, lo, hi)
                    t.clamp_(lo, hi)
            for j, b in enumerate(g):
                items[int(b)] = tuple(t[j] for t in batch)
        return items  # type: ignore[return-value]
