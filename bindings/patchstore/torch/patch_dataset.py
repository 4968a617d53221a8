"""patchstore.torch.PatchDataset: k random patches of a sample per item, as a map-style Dataset."""

from __future__ import annotations

import math
import operator
import os
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from .. import _patchstore as _C
from .._resume import ResumableDataset
from .._sampler import _sampler_options
from .._store import Store
from ._common import _SharedEpoch, _batch_tensor


class _Valid:
    """Where the top-left corner of a non-square patch may go in one sample (the NumPy fallback).

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


class PatchDataset(ResumableDataset, Dataset):
    """Random patches cut from the samples of a store (map-style).

    Item i is a dict {field: float32 tensor (k, C, P, P)} with k =
    patches_per_sample windows cut from sample i at the same positions in
    every field ((C, P, P) when k == 1). Values are as ingested: for images
    decoded from 8-bit PNG, x / 255 * 2 - 1 in float32; masks {0, 1}; EXR
    float data unchanged.

    path: a store path (or a Store). fields: the fields to return, e.g.
    ["rgb", "mask", "depth"]. patch_size: P, or (h, w).
    require: None, or the name of a 1-channel mask field (usually "mask"):
    then every patch holds at least `min_valid` valid (non-zero) pixels of
    that field (or, for 0 < min_valid < 1, that fraction of the patch).
    Samples without any valid position (an empty mask, or smaller than the
    patch) are skipped: index i then maps to the next sample (i+1, i+2, ...
    wrapping around) that has one, the same way in every process; each
    process warns once about each such item it serves. ValueError if no
    sample has a valid position.

    Positions: drawn by the C++ sampler (patchstore::PatchSampler::
    WindowOfSample), uniformly over the valid windows, which are found
    exactly from the mask's summed-area table stored at ingest: a function
    of (seed, epoch, i) only. Call set_epoch(e) before iterating epoch e (it
    reaches the workers, persistent or not). flip / rot90: random flips and
    quarter turns as in :class:`patchstore.PatchSampler`. (Non-square
    patches, (h, w) with h != w, are drawn by a NumPy fallback that supports
    neither min_valid != 1 nor flips; it keeps `cache_size` samples' valid
    positions per process.)

    transform: optional callable applied to the item dict (must pickle for
    spawn/forkserver workers: use a module-level function).

    Patches are copied out of the memory map with one C++ call per batch:
    DataLoader fetches a batch through __getitems__, which gathers all B*k
    patches of every field into one tensor per field (in shared memory
    inside a worker); the items are consecutive slices of it, so `collate`
    (below) returns that tensor without copying as (B*k, C, P, P).
    For the fastest loop, see :class:`BatchLoader`.
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
        min_valid: float = 1,
        flip: bool = False,
        rot90: bool = False,
        num_threads: int = 1,
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
        self.min_valid = min_valid
        self.transform = transform
        self.cache_size = max(1, int(cache_size))
        self._n = len(self.store)
        self._epoch = _SharedEpoch(0)
        self._options: Optional[Dict[str, Any]] = None
        if ph == pw:
            self._options = _sampler_options(self.fields, ph, self.patches_per_sample, require, min_valid, None,
                                             self.seed, 0, 1, num_threads, flip, rot90, what="PatchDataset")
        elif float(min_valid) != 1 or flip or rot90:
            raise ValueError(f"PatchDataset: non-square patches {self.patch_size} support neither min_valid != 1 "
                             f"nor flip/rot90")
        self._init_process()
        if self._options is not None:
            self._native()  # errors here, in the constructing process

    def _init_process(self) -> None:
        self._sampler: Optional[_C.Sampler] = None
        self._pid = -1
        self._eligible: Optional[np.ndarray] = None
        self._warned: Dict[int, None] = {}  # items already warned about (ordered set)
        self._cache: "OrderedDict[int, Optional[_Valid]]" = OrderedDict()  # non-square fallback
        self._empty: Dict[int, None] = {}

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_sampler", "_pid", "_eligible", "_warned", "_cache", "_empty", "_item_cache", "_pool"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process()

    def _native(self) -> "_C.Sampler":
        """The C++ sampler of this process (built after fork / unpickling)."""
        s = self._sampler
        if s is not None and self._pid == os.getpid():
            return s
        self._sampler = None
        s = _C.Sampler(self.store._r(), **self._options)
        self._eligible = np.flatnonzero(np.frombuffer(s.eligibility(), dtype=np.uint8)).astype(np.int64)
        self._sampler, self._pid = s, os.getpid()
        return s

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

    @property
    def skipped(self) -> int:
        """Samples without a valid position (their items read the next sample that has one)."""
        if self._options is None:
            return len(self._empty)
        self._native()
        return self._n - len(self._eligible)

    # -- positions ------------------------------------------------------------

    def _index(self, i: Any) -> int:
        n = self._n
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"PatchDataset index {i} out of range [0, {n})")
        return i

    def _why(self) -> str:
        ph, pw = self.patch_size
        if not self.require:
            return f"smaller than {ph}x{pw}"
        need = "a non-zero pixel" if float(self.min_valid) == 1 else f"min_valid={self.min_valid} valid pixels"
        return f"field '{self.require}' has no {ph}x{pw} window with {need}"

    def _no_sample(self) -> ValueError:
        return ValueError(f"PatchDataset: no sample of '{self.store.path}' has a valid "
                          f"{self.patch_size[0]}x{self.patch_size[1]} patch position"
                          + (f" (require='{self.require}'{self._need()})" if self.require else ""))

    def _need(self) -> str:
        """", min_valid=0.05: at least 3277 valid pixels of the 65536 in a window"."""
        ph, pw = self.patch_size
        mv = float(self.min_valid)
        need = max(1, math.ceil(mv * ph * pw) if mv < 1 else math.ceil(mv))
        note = f", min_valid={mv:g}: at least {need} valid pixels of the {ph * pw} in a window"
        if ph == pw:
            from .._sampler import _best_window
            note += _best_window(self.store, self.require, ph)
        return note

    def _windows(self, items: Sequence[int], epoch: Optional[int]) -> Tuple[np.ndarray, np.ndarray]:
        """(samples (B,), windows (B*k, 6)) for items (C++ sampler path)."""
        s = self._native()
        idx = np.fromiter((self._index(i) for i in items), dtype=np.int64, count=len(items))
        E = self._eligible
        if len(E) == 0:
            raise self._no_sample()
        samples = E[np.searchsorted(E, idx) % len(E)]
        moved = idx[samples != idx]
        first_j = None
        if len(moved):
            new = [int(i) for i in moved if int(i) not in self._warned]
            if new:
                for i in new:
                    self._warned[i] = None
                ids = [self.store.ids[i] for i in new]
                warnings.warn(
                    f"patchstore.torch.PatchDataset: skipping {len(new)} sample(s) of '{self.store.path}' "
                    f"({self._why()}): {ids[:20]}{' ...' if len(ids) > 20 else ''}; their items read the next "
                    f"sample that has one ({self._n - len(E)} of {self._n} samples have none)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            # An item that borrows sample s draws windows j0 = d*k ... of s (d = its distance to s), so it
            # does not repeat item s's own windows.
            first_j = ((samples - idx) % self._n) * self.patches_per_sample
        e = self.epoch if epoch is None else operator.index(epoch)
        wins = np.empty((len(idx) * self.patches_per_sample, 6), dtype=np.int64)
        s.windows_of_samples(e, samples, wins, first_j)
        return samples, wins

    def positions(self, i: int, epoch: Optional[int] = None) -> Tuple[int, np.ndarray, np.ndarray]:
        """(sample index, ys, xs): where item i's patches come from in `epoch` (default: the current one)."""
        if self._options is None:
            s, _, ys, xs = self._fallback_plan(i, epoch)
            return s, ys, xs
        samples, wins = self._windows([i], epoch)
        return int(samples[0]), wins[:, 1].copy(), wins[:, 2].copy()

    def windows(self, i: int, epoch: Optional[int] = None) -> np.ndarray:
        """Item i's windows as int64 rows (sample, y, x, flip, rot, positive) (square patches only)."""
        if self._options is None:
            raise ValueError("PatchDataset.windows: only for square patches")
        return self._windows([i], epoch)[1]

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        """Item i alone: the same values as ``__getitems__([i])[0]``, on a path cut to the copy itself.

        (In the training process, for a sample with a valid window; items in DataLoader workers, of
        skipped samples or of non-square patches take the batched path.)
        """
        if self._options is None or torch.utils.data.get_worker_info() is not None:
            return self.__getitems__([i])[0]
        s = self._native()
        cache = getattr(self, "_item_cache", None)
        if cache is None or cache[0] is not s:
            ok = np.zeros(self._n, dtype=np.uint8)
            ok[self._eligible] = 1
            cache = (s, ok.tobytes())
            self._item_cache = cache
        j = self._index(i)
        if not cache[1][j]:  # a skipped sample: the batched path warns and borrows the next one
            return self.__getitems__([i])[0]
        k = self.patches_per_sample
        ph, pw = self.patch_size
        wins = np.empty((k, 6), dtype=np.int64)
        s.windows_of_samples(self.epoch, np.array([j], dtype=np.int64), wins, None)
        arrays = [np.empty((k, c, ph, pw), dtype=np.float32) for c in s.channels]
        s.gather_windows(wins, arrays)
        item = {f: torch.from_numpy(a[0] if k == 1 else a) for f, a in zip(self.fields, arrays)}
        return item if self.transform is None else self.transform(item)

    def __getitems__(self, indices: Sequence[int]) -> List[Dict[str, torch.Tensor]]:
        """Items for a whole batch of indices (used by DataLoader's fetcher).

        All B*k patches of every field are gathered with one C++ call into
        one (B*k, C, P, P) tensor per field, allocated in shared memory
        inside a DataLoader worker; the items are consecutive slices of it,
        so `collate` returns that tensor without copying.
        """
        if self._options is None:
            return self._fallback_items(indices)
        indices = list(indices)
        k = self.patches_per_sample
        ph, pw = self.patch_size
        s = self._native()
        _, wins = self._windows(indices, None)
        shared = torch.utils.data.get_worker_info() is not None
        batch = {f: _batch_tensor(self, (len(indices) * k, c, ph, pw), shared, len(self.fields))
                 for f, c in zip(self.fields, s.channels)}
        s.gather_windows(wins, [batch[f].numpy() for f in self.fields])
        items: List[Dict[str, torch.Tensor]] = []
        for b in range(len(indices)):
            items.append({f: (t[b] if k == 1 else t[b * k:(b + 1) * k]) for f, t in batch.items()})
        if self.transform is not None:
            items = [self.transform(item) for item in items]
        return items

    def __repr__(self) -> str:
        return (f"PatchDataset('{self.store.path}', fields={list(self.fields)}, patch_size={self.patch_size}, "
                f"patches_per_sample={self.patches_per_sample}, require={self.require!r}, seed={self.seed}, "
                f"epoch={self.epoch}, samples={self._n})")

    # -- non-square patches: the NumPy fallback ---------------------------------------

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

    def _fallback_resolve(self, i: int) -> Tuple[int, _Valid]:
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
                warnings.warn(
                    f"patchstore.torch.PatchDataset: skipping {len(new)} sample(s) of '{self.store.path}' "
                    f"({self._why()}): {ids[:20]}{' ...' if len(ids) > 20 else ''}; "
                    f"{len(self._empty)} skipped so far in this process",
                    RuntimeWarning,
                    stacklevel=4,
                )
        raise self._no_sample()

    def _fallback_plan(self, i: int, epoch: Optional[int]) -> Tuple[int, _Valid, np.ndarray, np.ndarray]:
        i = self._index(i)
        s, v = self._fallback_resolve(i)
        e = self.epoch if epoch is None else operator.index(epoch)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, e, i])))
        t = rng.integers(0, v.total, size=self.patches_per_sample, dtype=np.int64)
        ys, xs = v.corners(t)
        return s, v, np.ascontiguousarray(ys, dtype=np.int64), np.ascontiguousarray(xs, dtype=np.int64)

    def _fallback_items(self, indices: Sequence[int]) -> List[Dict[str, torch.Tensor]]:
        plans = [self._fallback_plan(i, None) for i in indices]
        k = self.patches_per_sample
        ph, pw = self.patch_size
        reader = self.store._r()
        samples = np.repeat(np.array([p[0] for p in plans], dtype=np.int64), k)
        ys = np.concatenate([p[2] for p in plans]) if plans else np.zeros(0, np.int64)
        xs = np.concatenate([p[3] for p in plans]) if plans else np.zeros(0, np.int64)
        shared = torch.utils.data.get_worker_info() is not None
        items: List[Dict[str, torch.Tensor]] = [{} for _ in plans]
        for f in self.fields:
            c = plans[0][1].channels[f] if plans else self.store.fields[f].channels
            batch = _batch_tensor(self, (len(plans) * k, c, ph, pw), shared, len(self.fields))
            reader.copy_patches(samples, f, ys, xs, ph, pw, batch.numpy(), 1)
            for b in range(len(plans)):
                items[b][f] = batch[b] if k == 1 else batch[b * k:(b + 1) * k]
        if self.transform is not None:
            items = [self.transform(item) for item in items]
        return items
