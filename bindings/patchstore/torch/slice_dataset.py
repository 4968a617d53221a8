"""patchstore.torch.SliceDataset: 2D slices (or 2.5D stacks) of the volumes of a volume store."""

from __future__ import annotations

import dataclasses
import operator
import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from .. import _patchstore as _C
from .._config import UNSET, SliceConfig, resolve_slice_config
from .._resume import ResumableDataset
from .._sampler_options import _position
from .._shared import _SharedEpoch
from .._slice_options import canonical_context, field_clamps, field_contexts, to_native
from .._store import Store, reader_of
from .._volumes import SliceIndex, SliceRef, SliceTransform
from ._common import _batch_tensor, _empty
from ._stored import stored_dtypes

# The options SliceDataset took positionally after `fields`, in that order.
_POSITIONAL = ("context", "crop", "flip", "rot90", "seed")
# Options a state records only when they differ from these, so that states saved before mask-aware slices
# existed still load (and record the same options).
_RECORDED_WHEN_SET = {k: getattr(SliceConfig(), k) for k in ("require", "min_valid", "positive_fraction")}


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
    (`patchstore.ingest_hdf5`) as float32 (S, H, W) records, so slice
    k of every field is a contiguous block of the store's memory map.

    ``len(dataset)``: the number of slices over all volumes (or over `ids`,
    a train/validation split, in that order). Item i is the TUPLE of
    `fields` for flat slice i (``dataset.ref(i)`` says which volume and
    slice, see `patchstore.SliceIndex`), each a float32 tensor
    (2*c+1, H, W): slices k-c .. k+c, the end slice repeated where the
    stack crosses an end of the volume. ``context=c`` gives every field c
    slices on each side; ``context={"MR": 1, "CT": 0}`` gives each field
    its own (a field not named gets 0; naming a field that is not served
    is a ValueError), e.g. 3 MR slices in and the one CT slice out
    (``dataset.contexts`` holds them per field). With `crop` each is
    (2*c+1, h, w) (h = w = crop, or crop = (h, w)), cut at a random
    position, the same one in every field.

    Mask-aware slices and crops (as the frames sampler's ``require``,
    ``min_valid`` and ``positive_fraction``; MONAI's RandCropByPosNegLabeld,
    TorchIO's LabelSampler), decided by the mask voxels of the item's slice:

    * ``require="MASK"`` (with ``min_valid``, default 1 voxel; below 1 a
      fraction of the window): the items are only the slices whose window
      (the crop, or the whole slice without one) can hold at least min_valid
      valid (non-zero, not NaN) voxels of MASK, each once per epoch, its
      crop drawn uniformly from the crops that do. ``len(dataset)`` counts
      them; ``skipped_slices`` the others.
    * ``positive_fraction=p`` (with ``require``): every slice is an item, and
      each item is drawn from the qualifying slices and crops with
      probability p, from the others otherwise; item i serves its own slice
      when that slice has a window of the kind drawn, else a slice of that
      kind drawn uniformly from the same volume (``served(i)`` says which,
      ``positive(i)`` which kind).

    Which slices qualify is computed once here (each mask volume is read
    once, with a summed-area scan of the slices a crop leaves undecided),
    and handed to DataLoader workers with the dataset (no worker reads the
    masks again).

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
    `patchstore.SliceTransform`, whose ``apply`` does the same with
    NumPy on ``store.slice(...)``.

    Reproducibility: the transform (and, with require, the slice) of item i
    is a pure function of (seed, epoch, i) and the store: SplitMix64
    hashes, as the C++ patch sampler uses (reader/slice_sampler.h; see
    ``patchstore._volumes.draw_transforms``), so items do not depend on
    num_workers, the batch split, the worker start method or
    persistent_workers. Call ``set_epoch(e)`` before iterating epoch e: the
    epoch lives in shared memory and reaches the workers, persistent or not.

    Batches: DataLoader fetches a batch through ``__getitems__``, which
    copies all B stacks of each field with one C++ call (GIL released,
    ``num_threads`` threads) into one (B, 2c+1, h, w) tensor per field, in
    shared memory inside a worker; items are views of it, and
    `slice_collate` (or `collate`) passes those tensors through
    as the batch without another copy:

    ```python
    ds = SliceDataset("synthrad.ps", ("MR", "CT", "MASK"), crop=256, flip=True, rot90=True)
    # num_workers=0, the fastest: each batch is one __getitems__ call in this process, into reused buffers.
    loader = DataLoader(ds, batch_sampler=ds.batch_sampler(32, shuffle=True), collate_fn=slice_collate)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for A, B, M in loader:        # (32, 1, 256, 256) each
            ...
    ```

    In the training process (no workers), the batch tensors come from a
    small pool of buffers that are reused once nothing refers to a previous
    batch any more (never while the batch, an item, a view or a NumPy array
    of it is alive), so batch 32 or 64 of 2.5D stacks (40+ MB per field)
    costs no fresh memory mapping per batch; about two batches' worth of
    buffers stay allocated.

    output: "float32" (the default) or "stored": items hold each field in
    its stored dtype (int16/uint16 source values of a compact store,
    float16, float32), unclamped; `patchstore.torch.to_float`
    (``to_float(batch, dataset, device=...)``) gives the float32 items bit
    for bit, with this dataset's clamp applied.

    Options: the defaults are the C++ ones (``patchstore.SliceConfig()``);
    ``config=patchstore.SliceConfig(...)`` gives them all at once, and each
    as a keyword (context, crop, flip, rot90 and seed also positionally,
    in that order, after fields). Every value is checked once, in C++
    (SliceOptions::Validate), with the same words as the CLI.

    ids: a list (or other sequence) of volume ids, in that order; a single
    string is a TypeError and an empty list a ValueError. A volume that
    gives no item (no slice, slices smaller than ``crop``, or with
    ``require`` and min_valid no qualifying slice) is left out,
    as the window loaders skip a sample without a qualifying window:
    counted (``skipped``, ``skipped_ids``), warned about once here, never
    replaced by a neighbour; ValueError when none is left. Volumes whose
    slices differ in size need ``crop`` to be batched (warned here;
    `slice_collate` says so when a batch mixes them).

    Processes: pickles as the store path, the options and (with require)
    one byte per slice saying which qualify (fork, spawn and forkserver
    workers); each process reopens the store and rebuilds the slice index
    (one header read per record).

    Errors: KeyError for an unknown field or id, ValueError for bad options,
    a store of images (kind "frames"), a crop larger than every volume's slices
    or rot90 with non-square planes; IndexError for an index outside
    [-len, len).
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Store],
        fields: Union[str, Sequence[str]] = ("MR", "CT"),
        context: Any = UNSET,
        crop: Any = UNSET,
        flip: Any = UNSET,
        rot90: Any = UNSET,
        seed: Any = UNSET,
        *,
        config: Optional[SliceConfig] = None,
        verify_checksums: bool = False,
        **options: Any,
    ) -> None:
        super().__init__()
        who = "SliceDataset"
        given = {k: v for k, v in zip(_POSITIONAL, (context, crop, flip, rot90, seed)) if v is not UNSET}
        for k in given:
            if k in options:
                raise TypeError(f"{who}: got multiple values for argument '{k}'")
        self.config = resolve_slice_config(config, {**given, **options}, who)
        self.store = path if isinstance(path, Store) else Store(path, verify_checksums=verify_checksums)
        self.fields: Tuple[str, ...] = (fields,) if isinstance(fields, str) else tuple(fields)
        if not self.fields:
            raise ValueError("SliceDataset needs at least one field")
        native = to_native(self.fields, self.config, who, self.store)  # ValueError / TypeError / KeyError
        try:
            sampler = _C.SliceSampler(reader_of(self.store), native)  # reads the masks with require
        except (ValueError, KeyError, IndexError) as e:
            raise type(e)(f"{who}: {e.args[0] if e.args else e}") from None
        self.contexts: Dict[str, int] = field_contexts(native, self.fields)
        self.context: Union[int, Dict[str, int]] = canonical_context(self.contexts)
        self.crop: Optional[Tuple[int, int]] = native.crop
        self.flip: Union[bool, str] = native.flip
        self.rot90 = bool(native.rot90)
        self.seed = int(native.seed)
        self.require: Optional[str] = native.require or None
        self.min_valid = float(native.min_valid)
        self.positive_fraction: Optional[float] = (None if native.positive_fraction < 0
                                                   else float(native.positive_fraction))
        self.clamp = field_clamps(native.clamp, self.fields)
        self.clamp_warn: Optional[float] = None if native.clamp_warn < 0 else float(native.clamp_warn)
        self.output: str = native.output
        self.num_threads = int(native.num_threads)
        # Per field: the dtype items hold (stored dtypes for output="stored", whose clamp to_float applies).
        self._dtypes = (stored_dtypes(self.store, self.fields) if self.output == "stored"
                        else {f: torch.float32 for f in self.fields})
        self._saturated: Dict[str, float] = {}  # fields already warned about in this process
        ids = self.store.ids
        self.skipped_ids: List[str] = [ids[int(s)] for s in sampler.skipped]
        self.skipped_slices = int(sampler.skipped_slices)
        self._kept = [int(s) for s in sampler.kept]
        self._flags: Optional[bytes] = sampler.flags if self.require is not None else None
        self.index: SliceIndex = self.store.slice_index(self._kept)
        slices = np.frombuffer(sampler.item_slices(), dtype=np.int64)
        # The flat slice (of index) of each item; None: item i is slice i.
        self._item_slices: Optional[np.ndarray] = None if len(slices) == len(self.index) else slices
        self._native_cache: Any = (os.getpid(), sampler)
        if sampler.skipped_report:
            warnings.warn(f"patchstore.torch.SliceDataset: {sampler.skipped_report}. dataset.skipped_ids lists "
                          f"them.", RuntimeWarning, stacklevel=2)
        self._check_sizes()
        self._epoch = _SharedEpoch(0)

    def _sampler(self) -> Any:
        """This process's native SliceSampler: built in each process from the options, the volumes served
        and the slice flags (no mask is read again)."""
        h = self._native_cache
        if h is None or h[0] != os.getpid():
            native = to_native(self.fields, dataclasses.replace(self.config, ids=self._kept), "SliceDataset")
            h = self._native_cache = (os.getpid(), _C.SliceSampler(reader_of(self.store), native, self._flags))
        return h[1]

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
        """How many volumes were left out because they give no item (no slice, slices smaller than crop, or
        with require and min_valid no qualifying slice)."""
        return len(self.skipped_ids)

    def _check_sizes(self) -> None:
        """Warns when whole slices of several sizes would be batched together (no crop)."""
        if self.crop is not None:
            return
        ix = self.index
        sizes: Dict[Tuple[int, int], int] = {}
        for v in range(ix.volume_count):
            _, H, W = ix.shape(v)
            sizes.setdefault((H, W), v)
        if len(sizes) > 1:
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
        """The number of items: every slice of the served volumes, or with require and min_valid the
        qualifying ones."""
        return len(self.index) if self._item_slices is None else int(self._item_slices.shape[0])

    @property
    def options(self) -> Dict[str, Any]:
        """The options it was built with (context: one number, or {field: context} when the fields differ;
        ids: the volumes it reads, in order, after skipping those that give no item); what state_dict()
        records, less num_threads and clamp_warn (and require, min_valid and positive_fraction while they
        are off)."""
        return {"fields": self.fields, "context": self.context, "crop": self.crop, "flip": self.flip,
                "rot90": self.rot90, "seed": self.seed, "clamp": dict(self.clamp), "ids": self.index.volumes,
                "require": self.require, "min_valid": self.min_valid, "positive_fraction": self.positive_fraction,
                "num_threads": self.num_threads, "clamp_warn": self.clamp_warn}

    def _state_checks(self) -> Tuple[Dict[str, Any], Dict[str, Any], str]:
        legacy, options, store = super()._state_checks()
        for k, off in _RECORDED_WHEN_SET.items():
            if options.get(k) == off:
                del options[k]
        return legacy, options, store

    def __repr__(self) -> str:
        mask = (f", require={self.require!r}, min_valid={self.min_valid:g}"
                + (f", positive_fraction={self.positive_fraction:g}" if self.positive_fraction is not None else "")
                if self.require is not None else "")
        return (f"SliceDataset('{self.store.path}', fields={list(self.fields)}, context={self.context}, "
                f"crop={self.crop}, flip={self.flip!r}, rot90={self.rot90}, seed={self.seed}{mask}, "
                f"epoch={self.epoch}, items={len(self)}, volumes={self.index.volume_count})")

    def _normalise(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.fromiter((operator.index(i) for i in indices), dtype=np.int64, count=len(indices))
        n = len(self)
        idx[idx < 0] += n
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise IndexError(f"SliceDataset index {int(np.asarray(indices)[np.argmax(bad)])} out of range "
                             f"[0, {n}) for '{self.store.path}'")
        return idx

    def _item_rows(self, idx: np.ndarray) -> np.ndarray:
        """(n, 5) rows (sample, slice, depth, H, W) of the slices items `idx` stand for (ref)."""
        flat = idx if self._item_slices is None else self._item_slices[idx]
        return self.index._lookup(flat)

    def _locality_items(self) -> Tuple[np.ndarray, np.ndarray]:
        """Items in storage order (by sample index, then slice) and the bytes each adds to a block: one
        (H, W) plane of every field (a run of neighbouring slices reads each plane once; the context
        planes it shares with its neighbours are not counted again). For batch_sampler(order="locality")."""
        rows = self._item_rows(np.arange(len(self), dtype=np.int64))
        items = np.lexsort((rows[:, 1], rows[:, 0])).astype(np.int64)
        plane = rows[items, 3] * rows[items, 4] * 4 * len(self.fields)
        return items, plane.astype(np.uint64)

    def ref(self, i: int) -> SliceRef:
        """(volume id, slice) that item i stands for: the slice it serves, except that with positive_fraction
        a draw of the other kind serves another slice of the same volume (see `served`)."""
        idx = self._normalise([i])
        sample, k = (int(v) for v in self._item_rows(idx)[0, :2])
        return SliceRef(self.store.ids[sample], k)

    def _plan(self, idx: np.ndarray, epoch: Optional[int]) -> np.ndarray:
        """The (n, 12) int64 rows of normalised item indices in `epoch` (default: the current one), drawn in
        C++ (SliceSampler.draw): sample, slice, out_h, out_w, then the 7 SliceTransform columns (y, x,
        height, width, flip_v, flip_h, rot90), then positive."""
        e = self.epoch if epoch is None else _position(epoch, "epoch")
        out = np.empty((idx.shape[0], 12), dtype=np.int64)
        self._sampler().draw(e, np.ascontiguousarray(idx, dtype=np.int64), out)
        return out

    def served(self, i: int, epoch: Optional[int] = None) -> Tuple[SliceRef, SliceTransform]:
        """(the slice served, its crop/flips/turn) of item i in `epoch` (default: the current one).

        ``dataset[i][f]`` equals ``t.apply(store.slice(id, f, k, dataset.contexts[f]))`` with
        ``(id, k), t = dataset.served(i)`` (then clamped).
        """
        row = self._plan(self._normalise([i]), epoch)[0]
        return SliceRef(self.store.ids[int(row[0])], int(row[1])), SliceTransform.from_row(row[4:11])

    def positive(self, i: int, epoch: Optional[int] = None) -> bool:
        """Whether item i of `epoch` was drawn from the windows meeting min_valid (always True without
        require)."""
        return bool(self._plan(self._normalise([i]), epoch)[0, 11])

    def transform(self, i: int, epoch: Optional[int] = None) -> SliceTransform:
        """The crop, flips and rotation of item i in `epoch` (default: the current one): ``served(i)[1]``."""
        return self.served(i, epoch)[1]

    # -- items ------------------------------------------------------------------------

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, ...]:
        """Item i alone: the same values as ``__getitems__([i])[0]``, on a path cut to the copy itself.

        What DataLoader with batch_size=None or a per-item sampler calls, and what a loop over the
        dataset calls: one C++ call for the draw (SliceSampler.draw_item), no NumPy round trips, and one
        C++ copy per item (see bench/python_item_bench.py).
        """
        self._check_resume()
        sampler, n, reader, fields, depths, contexts, context = self._handles()
        j = operator.index(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"SliceDataset index {i} out of range [0, {n}) for '{self.store.path}'")
        sample, k, h, w, row, _ = sampler.draw_item(self.epoch, j)
        refs = np.array([[sample, k]], dtype=np.int64)  # per call: threads may share ds
        tr = np.array([row], dtype=np.int64)
        out: Sequence[torch.Tensor]
        if self.output == "stored":  # one tensor per field: their dtypes may differ
            out = [_empty((d, h, w), torch.utils.data.get_worker_info() is not None, self._dtypes[f])
                   for f, d in zip(self.fields, depths)]
            _C.copy_slice_stacks(reader, refs, tr, fields, context, [t.numpy()[None] for t in out], 1)
            return tuple(out)  # unclamped: to_float applies the clamp
        if torch.utils.data.get_worker_info() is None:
            # One allocation for all fields; the items are views of it (as __getitems__'s are of the batch).
            # NumPy views for the copy, one torch view per field (torch slicing costs microseconds).
            if isinstance(context, int):
                nf, d = len(fields), depths[0]
                buf = np.empty((nf, 1, d, h, w), dtype=np.float32)
                _C.copy_slice_stacks(reader, refs, tr, fields, context, list(buf), 1)
                out = torch.from_numpy(buf.reshape(nf, d, h, w)).unbind(0)
            else:
                flat = np.empty(sum(depths) * h * w, dtype=np.float32)
                ends = np.cumsum([d * h * w for d in depths]).tolist()
                parts = [flat[e - d * h * w:e].reshape(1, d, h, w) for d, e in zip(depths, ends)]  # views
                _C.copy_slice_stacks(reader, refs, tr, fields, context, parts, 1)
                sizes = [d * h * w for d in depths]
                out = [t.view(d, h, w) for t, d in zip(torch.split(torch.from_numpy(flat), sizes), depths)]
        else:  # in shared memory, which the worker hands to the training process without a copy
            out = [_empty((d, h, w), True) for d in depths]
            _C.copy_slice_stacks(reader, refs, tr, fields, context, [t.numpy()[None] for t in out], 1)
        for f, t in zip(self.fields, out):
            c = self.clamp.get(f)
            if c is not None:
                t.clamp_(c[0], c[1])
        return tuple(out)

    def _handles(self) -> Tuple[Any, ...]:
        """(native sampler, len, reader, fields, stack depth per field, context per field, and the context
        for the copy: one int when every field has it, else the list) of this process."""
        h = getattr(self, "_handle_cache", None)
        if h is None or h[0] != os.getpid():
            contexts = [self.contexts[f] for f in self.fields]
            context = contexts[0] if len(set(contexts)) == 1 else contexts
            h = (os.getpid(), self._sampler(), len(self), reader_of(self.store), list(self.fields),
                 [2 * c + 1 for c in contexts], contexts, context)
            self._handle_cache = h
        return h[1:]

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_pool", None)  # batch buffers belong to the process that made them
        state.pop("_handle_cache", None)  # per process
        state["_native_cache"] = None
        return state

    def __getitems__(self, indices: Sequence[int]) -> List[Tuple[torch.Tensor, ...]]:
        """Items for a whole batch of indices (used by DataLoader's fetcher): one C++ copy per field."""
        self._check_resume()
        indices = list(indices)
        idx = self._normalise(indices)
        n = idx.shape[0]
        if n == 0:
            return []
        rows = self._plan(idx, None)
        # Output plane per item: the crop (or the slice), swapped by odd turns.
        oh, ow = rows[:, 2], rows[:, 3]
        shared = torch.utils.data.get_worker_info() is not None
        reader = reader_of(self.store)
        contexts = [self.contexts[f] for f in self.fields]
        items: List[Optional[Tuple[torch.Tensor, ...]]] = [None] * n
        shapes = rows[:, 2:4]
        groups = [np.arange(n)] if (shapes == shapes[0]).all() else [
            np.flatnonzero((shapes == s).all(axis=1)) for s in np.unique(shapes, axis=0)]
        for g in groups:
            h, w = int(oh[g[0]]), int(ow[g[0]])
            batch = [_batch_tensor(self, (len(g), 2 * c + 1, h, w), shared, len(self.fields), self._dtypes[f])
                     for f, c in zip(self.fields, contexts)]
            refs = np.ascontiguousarray(rows[g][:, :2])
            _C.copy_slice_stacks(reader, refs, np.ascontiguousarray(rows[g][:, 4:11]), list(self.fields), contexts,
                                 [t.numpy() for t in batch], self.num_threads)
            for f, t in zip(self.fields, batch):
                if f in self.clamp and self.output == "float32":  # stored items: to_float clamps
                    lo, hi = self.clamp[f]
                    self._check_saturation(f, t, lo, hi)
                    t.clamp_(lo, hi)
            for j, b in enumerate(g):
                items[int(b)] = tuple(t[j] for t in batch)
        return items  # type: ignore[return-value]
