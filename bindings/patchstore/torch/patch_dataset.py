"""patchstore.torch.PatchDataset: k random patches of a sample per item, as a map-style Dataset."""

from __future__ import annotations

import operator
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from .. import _patchstore as _C
from .._config import UNSET, SamplerConfig, positional_options, resolve_config
from .._resume import ResumableDataset
from .._sampler_options import _best_window, _min_valid_note, _position, _warn_skipped, public_options, to_native
from .._shared import _SharedEpoch
from .._store import Store, _decode_id, reader_of
from ._common import _batch_tensor
from ._stored import check_output, stored_dtypes

# The options PatchDataset took by position before SamplerConfig (after path, fields, patch_size).
_POSITIONAL = ("patches_per_sample", "require", "seed")


class PatchDataset(ResumableDataset, Dataset[Dict[str, torch.Tensor]]):
    """Random patches cut from the samples of a store (map-style).

    Item i is a dict {field: float32 tensor (k, C, P, P)} with k =
    patches_per_sample windows cut from sample i at the same positions in
    every field ((C, P, P) when k == 1). Values are as ingested: for images
    decoded from 8-bit PNG, x / 255 * 2 - 1 in float32; masks {0, 1}; EXR
    float data unchanged.

    path: a store path (or a Store). fields: the fields to return, e.g.
    ["rgb", "mask", "depth"]. Sampling options: ``config=``
    `patchstore.SamplerConfig` and/or its fields as keywords, defaults
    from it (``patches_per_sample, require, seed`` still work by position
    after patch_size). patch_size: P, or (h, w).
    require: None, or the name of a 1-channel mask field (usually "mask"):
    then every patch holds at least `min_valid` valid (non-zero) pixels of
    that field (or, for 0 < min_valid < 1, that fraction of the patch).
    positive_fraction, policy, flip, rot90 (square patches), ids (a subset:
    sample ids or store indices, e.g. a train/val split): as
    `patchstore.PatchSampler` and BatchLoader, the same meaning.

    Items: item i is the i-th eligible sample (in store order; of the
    subset with ``ids``). Samples without any qualifying window (an empty
    mask, or smaller than the patch) are skipped: they have no item, are
    counted (`skipped`, `skipped_ids`) and reported in one
    RuntimeWarning when the dataset is built; never replaced by another
    sample. So with no sample skipped, item i is sample i. ValueError if no
    sample has a valid position.

    Positions: drawn by the C++ sampler (patchstore::PatchSampler::
    WindowOfSample), exactly uniformly over the valid windows (for any
    h x w; see PatchSampler): a function of (seed, epoch, sample) only. Call set_epoch(e)
    before iterating epoch e (it reaches the workers, persistent or not).
    ``patchstore montage --loader patchdataset`` shows items 0, 1, ... of
    an epoch. cache_size: ignored (kept so existing calls work; the C++
    sampler bounds its own window lists).

    transform: optional callable applied to the item dict (must pickle for
    spawn/forkserver workers: use a module-level function).

    Patches are copied out of the memory map with one C++ call per batch:
    DataLoader fetches a batch through __getitems__, which gathers all B*k
    patches of every field into one tensor per field (in shared memory
    inside a worker); the items are consecutive slices of it, so `collate`
    (below) returns that tensor without copying as (B*k, C, P, P).
    For the fastest loop, see `BatchLoader`.

    output: "float32" (the default) or "stored": items hold each field in
    its stored dtype (uint8 source values of a compact store, float16, ...),
    2.5-3.3x fewer bytes through the workers' shared memory and pin_memory;
    `patchstore.torch.to_float` (``to_float(batch, dataset,
    device="cuda")``) gives the float32 batch, bit for bit. A ``transform``
    then sees the stored tensors.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Store],
        fields: Union[str, Sequence[str]],
        patch_size: Any = UNSET,
        *positional: Any,
        config: Optional[SamplerConfig] = None,
        transform: Optional[Callable[[Dict[str, torch.Tensor]], Any]] = None,
        cache_size: int = 64,
        verify_checksums: bool = False,
        output: str = "float32",
        **options: Any,
    ) -> None:
        super().__init__()
        who = "PatchDataset"
        options = positional_options(who, patch_size, positional, _POSITIONAL, options)
        if isinstance(path, Store):
            self.store = path
        else:
            self.store = Store(path, verify_checksums=verify_checksums)
        self.config = resolve_config(config, options, who)
        self.fields: Tuple[str, ...] = (fields,) if isinstance(fields, str) else tuple(fields)
        if not self.fields:
            raise ValueError("PatchDataset needs at least one field")
        known = self.store.fields
        require = self.config.require
        for f in self.fields + ((require,) if require is not None else ()):
            if f not in known:
                raise KeyError(f"no field '{f}' in '{self.store.path}' (fields: {', '.join(known)})")
        self._opts = to_native(self.fields, self.config, who)
        self.seed = int(self._opts.seed)
        self.patch_size: Tuple[int, int] = (self._opts.patch_h or self._opts.patch_size,
                                            self._opts.patch_w or self._opts.patch_size)
        self.patches_per_sample = int(self._opts.patches_per_sample)
        self.require = require
        self.min_valid = self._opts.min_valid
        self.transform = transform
        self.cache_size = max(1, int(cache_size))
        self.output = check_output(output, who)
        # Per field: the dtype items hold (stored dtypes for output="stored").
        self._dtypes = (stored_dtypes(self.store, self.fields) if self.output == "stored"
                        else {f: torch.float32 for f in self.fields})
        self._epoch = _SharedEpoch(0)
        self._init_process()
        s = self._native()  # errors here, in the constructing process
        self._n = len(self._eligible_samples())
        _warn_skipped(s, "patchstore.torch.PatchDataset")

    def _init_process(self) -> None:
        self._sampler: Optional[_C.Sampler] = None
        self._pid = -1
        self._eligible: Optional[np.ndarray] = None

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_sampler", "_pid", "_eligible", "_pool", "_opts"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._opts = to_native(self.fields, self.config, "PatchDataset")
        self._init_process()

    def _native(self) -> "_C.Sampler":
        """The C++ sampler of this process (built after fork / unpickling)."""
        s = self._sampler
        if s is not None and self._pid == os.getpid():
            return s
        self._sampler = None
        s = _C.Sampler(reader_of(self.store), self._opts)
        self._eligible = np.frombuffer(s.eligible_list(), dtype=np.uint64).astype(np.int64)
        self._sampler, self._pid = s, os.getpid()
        return s

    def _eligible_samples(self) -> np.ndarray:
        """The eligible samples (store indices, ascending) as _native() set them: call it first."""
        e = self._eligible
        assert e is not None, "PatchDataset: _native() sets the eligible samples"
        return e

    @property
    def options(self) -> Dict[str, Any]:
        """The sampler options (as PatchSampler.options): what montage(loader=...) shows."""
        return public_options(self._opts)

    # -- epochs -------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Selects the positions of epoch `epoch` (>= 0). Call before iterating a DataLoader."""
        e = _position(epoch, "epoch")
        self._epoch.value = e

    def __len__(self) -> int:
        """Items: the eligible samples (skipped ones have no item)."""
        return self._n

    @property
    def skipped(self) -> int:
        """Samples without a qualifying window (they have no item)."""
        return int(self._native().skipped_samples)

    @property
    def skipped_ids(self) -> List[str]:
        """Ids of the skipped samples (the first 1000)."""
        return [_decode_id(b) for b in self._native().skipped_ids]

    def sample_of(self, i: int) -> int:
        """The store index of the sample item i reads."""
        self._native()
        return int(self._eligible_samples()[self._index(i)])

    # -- positions ------------------------------------------------------------

    def _index(self, i: Any) -> int:
        n = self._n
        k = operator.index(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"PatchDataset index {k} out of range [0, {n})")
        return k

    def _locality_items(self) -> Tuple[np.ndarray, np.ndarray]:
        """Items in storage order (item i is the i-th eligible sample, ascending) and the record bytes of
        their fields and mask (batch_sampler(order="locality"))."""
        s = self._native()
        return np.arange(self._n, dtype=np.int64), np.frombuffer(s.sample_bytes(), dtype=np.uint64)

    def _no_sample(self) -> ValueError:
        ph, pw = self.patch_size
        return ValueError(f"PatchDataset: no sample of '{self.store.path}' has a valid {ph}x{pw} patch position"
                          + (f" (require='{self.require}'{self._need(self.require)})" if self.require else ""))

    def _need(self, require: str) -> str:
        """", min_valid=0.05: at least 3277 valid pixels of the 65536 in a window"."""
        return (_min_valid_note(float(self.min_valid), self.patch_size)
                + _best_window(self.store, require, self.patch_size))

    def _windows(self, items: Sequence[int], epoch: Optional[int]) -> Tuple[np.ndarray, np.ndarray]:
        """(samples (B,), windows (B*k, 6)) for items."""
        s = self._native()
        if self._n == 0:
            raise self._no_sample()
        idx = np.fromiter((self._index(i) for i in items), dtype=np.int64, count=len(items))
        samples = self._eligible_samples()[idx]
        e = self.epoch if epoch is None else _position(epoch, "epoch")
        wins = np.empty((len(idx) * self.patches_per_sample, 6), dtype=np.int64)
        s.windows_of_samples(e, samples, wins, None)
        return samples, wins

    def positions(self, i: int, epoch: Optional[int] = None) -> Tuple[int, np.ndarray, np.ndarray]:
        """(sample index, ys, xs): where item i's patches come from in `epoch` (default: the current one)."""
        samples, wins = self._windows([i], epoch)
        return int(samples[0]), wins[:, 1].copy(), wins[:, 2].copy()

    def windows(self, i: int, epoch: Optional[int] = None) -> np.ndarray:
        """Item i's windows as int64 rows (sample, y, x, flip, rot, positive)."""
        return self._windows([i], epoch)[1]

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        """Item i alone: the same values as ``__getitems__([i])[0]``, on a path cut to the copy itself.

        (In the training process; inside DataLoader workers items take the batched path.)
        """
        if torch.utils.data.get_worker_info() is not None:
            return self.__getitems__([i])[0]
        self._check_resume()
        s = self._native()
        if self._n == 0:
            raise self._no_sample()
        j = int(self._eligible_samples()[self._index(i)])
        k = self.patches_per_sample
        ph, pw = self.patch_size
        wins = np.empty((k, 6), dtype=np.int64)
        s.windows_of_samples(self.epoch, np.array([j], dtype=np.int64), wins, None)
        tensors = [torch.empty((k, c, ph, pw), dtype=self._dtypes[f]) for f, c in zip(self.fields, s.channels)]
        s.gather_windows(wins, [t.numpy() for t in tensors])
        item = {f: (t[0] if k == 1 else t) for f, t in zip(self.fields, tensors)}
        return item if self.transform is None else self.transform(item)

    def __getitems__(self, indices: Sequence[int]) -> List[Dict[str, torch.Tensor]]:
        """Items for a whole batch of indices (used by DataLoader's fetcher).

        All B*k patches of every field are gathered with one C++ call into
        one (B*k, C, h, w) tensor per field, allocated in shared memory
        inside a DataLoader worker; the items are consecutive slices of it,
        so `collate` returns that tensor without copying.
        """
        self._check_resume()
        indices = list(indices)
        k = self.patches_per_sample
        ph, pw = self.patch_size
        s = self._native()
        _, wins = self._windows(indices, None)
        shared = torch.utils.data.get_worker_info() is not None
        batch = {f: _batch_tensor(self, (len(indices) * k, c, ph, pw), shared, len(self.fields), self._dtypes[f])
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
                f"epoch={self.epoch}, items={self._n}, skipped={self.skipped})")
