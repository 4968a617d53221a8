"""patchstore.torch: random patches from a store as a map-style torch Dataset.

Replaces a Dataset that decodes PNG/EXR files per item::

    from torch.utils.data import DataLoader
    from patchstore.torch import PatchDataset, collate

    train = PatchDataset("frames.ps", ["rgb", "mask", "depth"], patch_size=256,
                         patches_per_sample=4, require="mask")
    loader = DataLoader(train, batch_size=4, shuffle=True, num_workers=4,
                        pin_memory=True, persistent_workers=True, collate_fn=collate)
    for epoch in range(epochs):
        train.set_epoch(epoch)            # before iterating: new positions each epoch
        for batch in loader:              # batch["rgb"]: (16, 3, 256, 256) float32 in [-1, 1]
            ...

Reproducibility: the patch positions of item i are a function of
(seed, epoch, i) only, so a run yields the same patches whatever
num_workers, the start method (fork, spawn, forkserver) or
persistent_workers are.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.context
import operator
import os
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from ._store import Store

__all__ = ["PatchDataset", "collate"]


class _SharedEpoch:
    """An int64 shared by the main process and DataLoader workers.

    Workers see set_epoch() even with persistent_workers=True: under fork the
    shared memory is inherited; under spawn/forkserver it is passed as a file
    descriptor while the worker is being started. Pickled at any other time
    (e.g. to disk), it is saved as a plain value.
    """

    def __init__(self, value: int = 0) -> None:
        self._shared: Any = None
        self._value = int(value)
        try:
            self._shared = multiprocessing.RawValue(ctypes.c_int64, int(value))
        except OSError:  # no shared memory available: per-process value
            self._shared = None

    @property
    def value(self) -> int:
        return int(self._shared.value) if self._shared is not None else self._value

    @value.setter
    def value(self, v: int) -> None:
        if self._shared is not None:
            self._shared.value = int(v)
        self._value = int(v)

    def __getstate__(self) -> Dict[str, Any]:
        if self._shared is not None and multiprocessing.context.get_spawning_popen() is not None:
            return {"shared": self._shared, "value": self.value}
        return {"shared": None, "value": self.value}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._value = state["value"]
        self._shared = state["shared"]
        if self._shared is None:
            self.__init__(state["value"])  # type: ignore[misc]


class _Valid:
    """Where the top-left corner of a patch may go in one sample.

    Positions are numbered row-major over the (ny, nx) grid of corners that
    keep the patch inside the sample; `rows` holds, per grid row, the valid
    corners as packed bits (None: every corner is valid), `cum` the running
    count of valid corners up to and including each row.
    """

    __slots__ = ("ny", "nx", "total", "rows", "cum", "channels")

    def __init__(self, ny: int, nx: int, channels: Dict[str, int],
                 rows: Optional[np.ndarray] = None, cum: Optional[np.ndarray] = None) -> None:
        self.ny, self.nx, self.channels, self.rows, self.cum = ny, nx, channels, rows, cum
        self.total = int(cum[-1]) if cum is not None else ny * nx

    def nbytes(self) -> int:
        return 0 if self.rows is None else self.rows.nbytes + self.cum.nbytes

    def corners(self, t: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The corners of valid positions number `t` (0 <= t < total)."""
        if self.rows is None:
            return t // self.nx, t % self.nx
        ys = np.searchsorted(self.cum, t, side="right")
        xs = np.empty_like(t)
        for j, (y, k) in enumerate(zip(ys, t)):
            before = int(self.cum[y - 1]) if y > 0 else 0
            cols = np.flatnonzero(np.unpackbits(self.rows[y], count=self.nx))
            xs[j] = cols[int(k) - before]
        return ys.astype(np.int64), xs


class PatchDataset(Dataset):
    """Random patches cut from the samples of a store.

    Item i is a dict {field: float32 tensor (k, C, P, P)} with k =
    patches_per_sample windows cut from sample i at the same positions in
    every field ((C, P, P) when k == 1). Values are as ingested: for images
    decoded from 8-bit PNG, x / 255 * 2 - 1 in float32; masks {0, 1}; EXR
    float data unchanged.

    path: a store path (or a Store). fields: the fields to return, e.g.
    ["rgb", "mask", "depth"]. patch_size: P, or (h, w).
    require: None, or the name of a field (usually "mask"): then every patch
    holds at least one non-zero pixel of that field. Valid positions are
    computed once per sample (an integral image of field != 0, so each window
    test is O(1)) and cached per process (`cache_size` samples).
    Samples without any valid position (an empty mask, or smaller than the
    patch) are skipped: index i then maps to the next sample (i+1, i+2, ...
    wrapping around) that has one, the same way in every process; each
    process warns once about the samples it found so. ValueError if no
    sample has a valid position.

    Positions: uniform over the valid top-left corners, drawn from
    numpy.random.Generator(PCG64(SeedSequence([seed, epoch, i]))): a
    function of (seed, epoch, i) only. Call set_epoch(e) before iterating
    epoch e (it reaches the workers, persistent or not).

    transform: optional callable applied to the item dict (must pickle for
    spawn/forkserver workers: use a module-level function).

    Patches are copied out of the memory map with one C++ call per field
    and batch: DataLoader fetches a batch through __getitems__, which gathers
    all B*k patches of a field into one tensor (in shared memory inside a
    worker). Use collate (below) as the DataLoader's collate_fn to get
    (B*k, C, P, P) batches; it hands that tensor on without copying.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Store],
        fields: Union[str, Sequence[str]],
        patch_size: Union[int, Tuple[int, int]],
        patches_per_sample: int = 1,
        require: Optional[str] = None,
        seed: int = 0,
        *,
        transform: Optional[Callable[[Dict[str, torch.Tensor]], Any]] = None,
        cache_size: int = 64,
        verify_checksums: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(path, Store):
            self.store = path
        else:
            self.store = Store(path, verify_checksums=verify_checksums)
        self.fields: Tuple[str, ...] = (fields,) if isinstance(fields, str) else tuple(fields)
        if not self.fields:
            raise ValueError("PatchDataset needs at least one field")
        known = self.store.fields
        for f in self.fields + ((require,) if require is not None else ()):
            if f not in known:
                raise KeyError(f"no field '{f}' in '{self.store.path}' (fields: {', '.join(known)})")
        if isinstance(patch_size, int):
            ph = pw = patch_size
        else:
            ph, pw = (int(v) for v in patch_size)
        if ph < 1 or pw < 1:
            raise ValueError(f"patch_size must be positive, got {patch_size!r}")
        self.patch_size: Tuple[int, int] = (ph, pw)
        self.patches_per_sample = operator.index(patches_per_sample)
        if self.patches_per_sample < 1:
            raise ValueError(f"patches_per_sample must be >= 1, got {patches_per_sample!r}")
        self.require = require
        self.seed = operator.index(seed)
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed!r}")
        self.transform = transform
        self.cache_size = max(1, int(cache_size))
        self._n = len(self.store)
        self._epoch = _SharedEpoch(0)
        self._init_cache()

    def _init_cache(self) -> None:
        self._cache: "OrderedDict[int, Optional[_Valid]]" = OrderedDict()
        self._empty: Dict[int, None] = {}  # samples without a valid position (ordered set)

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_cache", "_empty"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_cache()

    # -- epochs -------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Selects the positions of epoch `epoch` (>= 0). Call before iterating a DataLoader."""
        e = operator.index(epoch)
        if e < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch!r}")
        self._epoch.value = e

    def __len__(self) -> int:
        return self._n

    # -- positions ------------------------------------------------------------

    def _valid(self, sample: int) -> Optional[_Valid]:
        """Valid corners of `sample` (cached, LRU per process), None when there are none."""
        cache = self._cache
        if sample in cache:
            cache.move_to_end(sample)
            return cache[sample]
        ph, pw = self.patch_size
        names = self.fields + ((self.require,) if self.require is not None and self.require not in self.fields else ())
        channels: Dict[str, int] = {}
        H = W = None
        for f in names:
            c, h, w = self.store.shape(sample, f)[:3]
            channels[f] = c
            H = h if H is None else min(H, h)
            W = w if W is None else min(W, w)
        v: Optional[_Valid] = None
        if H >= ph and W >= pw:
            ny, nx = H - ph + 1, W - pw + 1
            if self.require is None:
                v = _Valid(ny, nx, channels)
            else:
                m = self.store.get(sample, self.require)[:, :H, :W]  # zero-copy view
                nz = (m != 0).any(axis=0) if m.shape[0] > 1 else (m[0] != 0)
                ii = np.zeros((H + 1, W + 1), dtype=np.int32)
                np.cumsum(nz, axis=0, dtype=np.int32, out=ii[1:, 1:])
                np.cumsum(ii[1:, 1:], axis=1, out=ii[1:, 1:])
                sums = ii[ph:ph + ny, pw:pw + nx] - ii[:ny, pw:pw + nx] - ii[ph:ph + ny, :nx] + ii[:ny, :nx]
                ok = sums > 0
                del ii, sums
                counts = ok.sum(axis=1, dtype=np.int64)
                if counts.sum() > 0:
                    v = _Valid(ny, nx, channels, np.packbits(ok, axis=1), np.cumsum(counts))
        cache[sample] = v
        while len(cache) > self.cache_size:
            cache.popitem(last=False)
        return v

    def _resolve(self, i: int) -> Tuple[int, _Valid]:
        """The sample that item i reads (i itself unless it has no valid position)."""
        n = self._n
        new: List[int] = []
        try:
            for step in range(n):
                s = (i + step) % n
                if s in self._empty:
                    continue
                v = self._valid(s)
                if v is not None:
                    return s, v
                self._empty[s] = None
                new.append(s)
        finally:
            if new:
                ids = [self.store.ids[s] for s in new]
                why = (f"field '{self.require}' has no non-zero pixel in any {self.patch_size[0]}x"
                       f"{self.patch_size[1]} window" if self.require else
                       f"smaller than {self.patch_size[0]}x{self.patch_size[1]}")
                warnings.warn(
                    f"patchstore.torch.PatchDataset: skipping {len(new)} sample(s) of '{self.store.path}' "
                    f"({why}): {ids[:20]}{' ...' if len(ids) > 20 else ''}; "
                    f"{len(self._empty)} skipped so far in this process",
                    RuntimeWarning,
                    stacklevel=3,
                )
        raise ValueError(f"PatchDataset: no sample of '{self.store.path}' has a valid "
                         f"{self.patch_size[0]}x{self.patch_size[1]} patch position"
                         + (f" (require='{self.require}')" if self.require else ""))

    def _plan(self, i: int, epoch: Optional[int]) -> Tuple[int, _Valid, np.ndarray, np.ndarray]:
        n = self._n
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"PatchDataset index {i} out of range [0, {n})")
        s, v = self._resolve(i)
        e = self.epoch if epoch is None else operator.index(epoch)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, e, i])))
        t = rng.integers(0, v.total, size=self.patches_per_sample, dtype=np.int64)
        ys, xs = v.corners(t)
        return s, v, np.ascontiguousarray(ys, dtype=np.int64), np.ascontiguousarray(xs, dtype=np.int64)

    def positions(self, i: int, epoch: Optional[int] = None) -> Tuple[int, np.ndarray, np.ndarray]:
        """(sample index, ys, xs): where item i's patches come from in `epoch` (default: the current one)."""
        s, _, ys, xs = self._plan(i, epoch)
        return s, ys, xs

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> List[Dict[str, torch.Tensor]]:
        """Items for a whole batch of indices (used by DataLoader's fetcher).

        All B*k patches of a field are gathered with one C++ call into one
        (B*k, C, P, P) tensor, allocated in shared memory inside a DataLoader
        worker; the items are consecutive slices of it, so `collate` returns
        that tensor without copying.
        """
        plans = [self._plan(i, None) for i in indices]
        k = self.patches_per_sample
        ph, pw = self.patch_size
        reader = self.store._r()
        samples = np.repeat(np.array([p[0] for p in plans], dtype=np.int64), k)
        ys = np.concatenate([p[2] for p in plans]) if plans else np.zeros(0, np.int64)
        xs = np.concatenate([p[3] for p in plans]) if plans else np.zeros(0, np.int64)
        shared = torch.utils.data.get_worker_info() is not None
        items: List[Dict[str, torch.Tensor]] = [{} for _ in plans]
        for f in self.fields:
            channels = {p[1].channels[f] for p in plans}
            if len(channels) == 1:
                (c,) = channels
                batch = _empty((len(plans) * k, c, ph, pw), shared)
                reader.copy_patches(samples, f, ys, xs, ph, pw, batch.numpy(), 1)
                for b in range(len(plans)):
                    items[b][f] = batch[b] if k == 1 else batch[b * k:(b + 1) * k]
            else:  # samples disagree on the channel count of this field: one tensor per item
                for b, (s, v, y, x) in enumerate(plans):
                    t = torch.empty((k, v.channels[f], ph, pw), dtype=torch.float32)
                    reader.copy_patches(samples[b * k:(b + 1) * k], f, y, x, ph, pw, t.numpy(), 1)
                    items[b][f] = t[0] if k == 1 else t
        if self.transform is not None:
            items = [self.transform(item) for item in items]
        return items

    def __repr__(self) -> str:
        return (f"PatchDataset('{self.store.path}', fields={list(self.fields)}, patch_size={self.patch_size}, "
                f"patches_per_sample={self.patches_per_sample}, require={self.require!r}, seed={self.seed}, "
                f"epoch={self.epoch}, samples={self._n})")


def _empty(shape: Tuple[int, ...], shared: bool) -> torch.Tensor:
    """A float32 tensor, in shared memory when `shared` (as default_collate does in workers)."""
    if shared:
        try:
            proto = torch.empty(0, dtype=torch.float32)
            storage = proto._typed_storage()._new_shared(int(np.prod(shape)), device=proto.device)
            return proto.new(storage).resize_(*shape)
        except (AttributeError, RuntimeError, TypeError):  # private API moved: plain memory
            pass
    return torch.empty(shape, dtype=torch.float32)


def _consecutive(ts: List[Any]) -> Optional[torch.Tensor]:
    """If tensors `ts` are back-to-back slices of one storage, that memory as one (len, *shape) tensor."""
    t0 = ts[0]
    if not isinstance(t0, torch.Tensor) or not t0.is_contiguous():
        return None
    storage = t0.untyped_storage()
    step = t0.numel() * t0.element_size()
    for b, t in enumerate(ts):
        if (not isinstance(t, torch.Tensor) or t.dtype != t0.dtype or t.shape != t0.shape
                or t.device != t0.device or not t.is_contiguous()
                or t.untyped_storage().data_ptr() != storage.data_ptr()
                or t.data_ptr() != t0.data_ptr() + b * step):
            return None
    return t0.new_empty(0).set_(storage, t0.storage_offset(), (len(ts),) + tuple(t0.shape))


def collate(batch: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Collates PatchDataset items, flattening the k patches of each item into the batch.

    Items {field: (k, C, P, P)} become {field: (B*k, C, P, P)} (the seed's
    torch.cat collate); items {field: (C, P, P)} (k == 1) become (B, C, P, P).
    When the items come from PatchDataset's batched fetch (DataLoader calls
    __getitems__), their patches already lie back to back in one tensor and
    that tensor is returned without a copy. Anything else is collated by
    torch's default_collate (in shared memory inside workers), then flattened.
    """
    if not batch:
        return {}
    if not isinstance(batch[0], dict):
        return default_collate(batch)
    out: Dict[str, Any] = {}
    for key in batch[0]:
        values = [item[key] for item in batch]
        first = values[0]
        joined = _consecutive(values)
        if joined is None:
            joined = default_collate(values)
        if isinstance(first, torch.Tensor) and first.dim() == 4:
            joined = joined.view(-1, *joined.shape[2:])
        out[key] = joined
    return out
