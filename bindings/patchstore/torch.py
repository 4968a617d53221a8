"""patchstore.torch: random patches (image stores) and slices (volume stores) for torch training.

Image stores: two ways in, both on the C++ sampler (patchstore::PatchSampler: exact
mask-aware uniform windows from the summed-area tables stored at ingest,
deterministic, gathered with the GIL released):

``BatchLoader`` -- ready (B, C, P, P) batches, no per-sample Python work,
reusing a small ring of (optionally pinned) buffers. The fastest path:
iterate it directly in the training process::

    from patchstore.torch import BatchLoader

    loader = BatchLoader("frames.ps", ["rgb", "mask", "depth"], patch_size=256, batch_size=64,
                         patches_per_sample=4, require="mask", num_threads=2, pin_memory=True)
    for epoch in range(epochs):
        loader.set_epoch(epoch)           # optional: without it each iter() takes the next epoch
        for batch in loader:              # batch["rgb"]: (64, 3, 256, 256) float32 in [-1, 1]
            rgb = batch["rgb"].cuda(non_blocking=True)
            ...

``PatchDataset`` -- a map-style Dataset (item i = k patches of sample i) for
code built around DataLoader(shuffle=True, num_workers=...)::

    from torch.utils.data import DataLoader
    from patchstore.torch import PatchDataset, collate

    train = PatchDataset("frames.ps", ["rgb", "mask", "depth"], patch_size=256,
                         patches_per_sample=4, require="mask")
    loader = DataLoader(train, batch_size=16, shuffle=True, num_workers=4,
                        pin_memory=True, persistent_workers=True, collate_fn=collate)
    for epoch in range(epochs):
        train.set_epoch(epoch)            # before iterating: new positions each epoch
        for batch in loader:              # batch["rgb"]: (64, 3, 256, 256)
            ...

Volume stores (:func:`patchstore.ingest_hdf5`): ``SliceDataset`` -- item i
is the tuple of fields of flat slice i, (2c+1, H, W) each, with an optional
random crop, flips and quarter turns done inside the one C++ copy::

    from patchstore.torch import SliceDataset, slice_collate

    train = SliceDataset("synthrad.ps", ("MR", "CT", "MASK"), crop=256, flip=True, rot90=True,
                         clamp={"MR": (-1, 1), "CT": (-1, 1)})
    loader = DataLoader(train, batch_size=32, shuffle=True, num_workers=4, collate_fn=slice_collate)
    for epoch in range(epochs):
        train.set_epoch(epoch)
        for A, B, M in loader:            # (32, 1, 256, 256) each
            ...

Reproducibility: windows and slice transforms depend on (seed, epoch,
position) only, so a run yields the same items whatever num_workers,
num_threads, the start method (fork, spawn, forkserver) or
persistent_workers are.

Resuming mid-epoch: ``state_dict()`` / ``load_state_dict(state)`` on all
three (small dicts of ints and strings, saved with the model checkpoint):
after loading, the rest of the saved epoch and every later epoch are those
of the uninterrupted run. A BatchLoader iterated directly counts its
batches; map-style datasets resume through ``dataset.batch_sampler(...)``
(see :class:`EpochBatchSampler`) with ``state_dict(batch=step)``; torchdata's
StatefulDataLoader works with all three as well.
"""

from __future__ import annotations

import bisect
import ctypes
import math
import multiprocessing
import multiprocessing.context
import operator
import os
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

from . import _patchstore as _C
from ._sampler import PatchSampler, _sampler_options
from ._store import Store
from ._resume import EpochBatchSampler, ResumableDataset, distributed_defaults
from ._volumes import SliceIndex, SliceRef, SliceTransform, draw_transforms

__all__ = ["BatchLoader", "EpochBatchSampler", "PatchDataset", "SliceDataset", "collate", "slice_collate"]


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


class _EpochCounter:
    """Which epoch an iter() yields, shared by a BatchLoader and its DataLoader workers.

    Slot 0 holds the epoch given to set_epoch(); slot 1 counts the iter()
    calls in the training process, slot 2 + w those of DataLoader worker w.
    An iter() yields epoch slot[0] + its slot's count and bumps the count,
    so every process advances one epoch per iteration (DataLoader calls
    iter() once per epoch in every worker, persistent or not), and
    set_epoch() resets all counts. Shared memory reaches the workers as
    _SharedEpoch's does (inherited under fork, passed while spawning).
    """

    SLOTS = 2 + 256

    def __init__(self) -> None:
        try:
            self._shared: Any = multiprocessing.RawArray(ctypes.c_int64, self.SLOTS)
        except OSError:  # no shared memory: per-process counts
            self._shared = [0] * self.SLOTS

    def take(self, slot: int) -> int:
        a = self._shared
        e = int(a[0]) + int(a[slot])
        a[slot] = int(a[slot]) + 1
        return e

    def peek(self, slot: int) -> int:
        return int(self._shared[0]) + int(self._shared[slot])

    def set(self, epoch: int) -> None:
        a = self._shared
        for i in range(1, self.SLOTS):
            a[i] = 0
        a[0] = int(epoch)

    def __getstate__(self) -> Dict[str, Any]:
        if not isinstance(self._shared, list) and multiprocessing.context.get_spawning_popen() is not None:
            return {"shared": self._shared}
        return {"values": [int(v) for v in self._shared]}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if "shared" in state:
            self._shared = state["shared"]
        else:
            self.__init__()  # type: ignore[misc]
            for i, v in enumerate(state["values"]):
                self._shared[i] = v


def _storage_uses(tensors: Dict[str, torch.Tensor]) -> Optional[List[int]]:
    """How many tensors share each buffer's storage (None if torch cannot tell)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    try:
        return [int(count(t.untyped_storage()._cdata)) for t in tensors.values()]
    except (AttributeError, RuntimeError, TypeError):
        return None


class _Slot:
    __slots__ = ("tensors", "arrays", "uses", "event")

    def __init__(self, tensors: Dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.arrays = {f: t.numpy() for f, t in tensors.items()}  # what the C++ gather writes through
        self.uses = _storage_uses(tensors)
        self.event: Any = None  # CUDA event after the batch was handed out (pinned memory)

    def free(self) -> bool:
        # A yielded batch (or any view of it) still alive raises the storage's use count.
        return self.uses is None or _storage_uses(self.tensors) == self.uses


class _Ring:
    """`count` sets of (B, C, P, P) buffers, reused in turn; never one still referenced by a caller."""

    def __init__(self, shapes: Dict[str, Tuple[int, ...]], count: int, pin: bool, owner: str) -> None:
        self.shapes, self.count, self.pin, self.owner = shapes, count, pin, owner
        self.slots: List[_Slot] = []
        self.next = 0
        self.warned = False
        self.cuda = False
        self.last: Optional[_Slot] = None

    def _allocate(self) -> _Slot:
        tensors = {}
        for f, shape in self.shapes.items():
            t = None
            if self.pin:
                try:
                    t = torch.empty(shape, dtype=torch.float32, pin_memory=True)
                    self.cuda = torch.cuda.is_available() and t.is_pinned()
                except RuntimeError as e:  # CPU-only torch: no pinned allocator
                    warnings.warn(f"patchstore.torch.BatchLoader: pin_memory=True but pinned memory is not "
                                  f"available ({e}); using ordinary memory", RuntimeWarning, stacklevel=4)
                    self.pin = False
            if t is None:
                t = torch.empty(shape, dtype=torch.float32)
            tensors[f] = t
        return _Slot(tensors)

    def acquire(self) -> _Slot:
        if self.cuda and self.last is not None:
            # Copies of the previous batch that the caller queued since it was
            # handed out (x.cuda(non_blocking=True)) must finish before its
            # buffer is refilled.
            try:
                self.last.event = torch.cuda.Event()
                self.last.event.record(torch.cuda.current_stream())
            except RuntimeError:
                self.last.event = None
        slot = None
        n = len(self.slots)
        free = [(self.next + step) % n for step in range(n) if self.slots[(self.next + step) % n].free()]
        # Prefer a set whose queued copies are done; else a new set (up to `count`); else wait below.
        for i in free:
            if self.slots[i].event is None or self.slots[i].event.query():
                slot = self.slots[i]
                break
        if slot is None and n >= self.count and free:
            slot = self.slots[free[0]]
        if slot is not None:
            self.next = (self.slots.index(slot) + 1) % self.count
        if slot is None and n < self.count:
            slot = self._allocate()
            self.slots.append(slot)
            self.next = len(self.slots) % self.count
        if slot is None:
            if not self.warned:
                warnings.warn(f"{self.owner}: all {self.count} batch buffers are still referenced (batches kept "
                              f"beyond buffers={self.count}); allocating a new buffer per batch",
                              RuntimeWarning, stacklevel=4)
                self.warned = True
            slot = self._allocate()  # not kept: freed when the caller lets go
        if slot.event is not None:
            slot.event.synchronize()
            slot.event = None
        self.last = slot
        return slot


class _BufferPool:
    """Float32 batch buffers reused from one batch to the next, in one process.

    Why: one field of a 2.5D batch (32 stacks of 5 x 256 x 256) is 42 MB.
    glibc serves allocations above its mmap threshold (32 MiB at most,
    whatever it has adapted to) with a fresh mapping and unmaps it on free,
    so a new tensor per batch pays one page fault and one page of zeroing
    per 4 KiB on first touch: batch 32 ran 4-6x slower than batch 16, and
    only MALLOC_MMAP_THRESHOLD_ in the environment helped. Reusing buffers
    makes the batch paths independent of the batch size and of glibc's
    settings.

    A buffer is handed out again only once nothing refers to its storage any
    more (torch's storage use count is back to the pool's own reference):
    items, collated batches, views and NumPy arrays of a batch the caller
    still holds keep it busy, and a busy buffer is never overwritten. A
    request takes the smallest free buffer that is large enough (a smaller
    last batch reuses a full one) or allocates; at most `keep` buffers are
    retained (about two batches' worth: the one the caller holds while the
    next is fetched). Where torch cannot report use counts, every request
    allocates (the old behaviour).
    """

    def __init__(self, keep: int) -> None:
        self.keep = max(1, int(keep))
        self.bufs: List[Tuple[torch.Tensor, List[int]]] = []  # (flat buffer, its idle use count)
        self.pid = os.getpid()

    @staticmethod
    def _uses(t: torch.Tensor) -> Optional[List[int]]:
        return _storage_uses({"": t})

    def take(self, shape: Tuple[int, ...]) -> torch.Tensor:
        if self.pid != os.getpid():  # forked: the parent's buffers are not ours to reuse
            self.bufs, self.pid = [], os.getpid()
        n = int(np.prod(shape))
        best = -1
        for j, (b, idle) in enumerate(self.bufs):
            if b.numel() >= n and (best < 0 or b.numel() < self.bufs[best][0].numel()) and self._uses(b) == idle:
                best = j
        if best >= 0:
            return self.bufs[best][0][:n].view(shape)
        flat = torch.empty(max(n, 1), dtype=torch.float32)
        idle = self._uses(flat)
        if idle is not None:
            if len(self.bufs) < self.keep:
                self.bufs.append((flat, idle))
            else:  # replace the smallest free buffer, if any (keeps the pool at `keep`)
                free = [j for j, (b, i) in enumerate(self.bufs) if self._uses(b) == i]
                if free:
                    self.bufs[min(free, key=lambda j: self.bufs[j][0].numel())] = (flat, idle)
        return flat[:n].view(shape)


def _pool_of(owner: Any, fields: int) -> Optional[_BufferPool]:
    """The owner's buffer pool (created on first use, never pickled); None when pooling is off."""
    if not _POOL_BATCH_BUFFERS:
        return None
    pool = owner.__dict__.get("_pool")
    if pool is None:
        pool = owner.__dict__["_pool"] = _BufferPool(3 * max(1, fields))
    return pool


# Reuse batch buffers in the training process (see _BufferPool). Only the
# benchmarks switch this off, to measure the per-batch allocation it replaces.
_POOL_BATCH_BUFFERS = True


def _batch_tensor(owner: Any, shape: Tuple[int, ...], shared: bool, fields: int) -> torch.Tensor:
    """A float32 batch tensor: fresh shared memory inside a DataLoader worker, a pooled buffer otherwise."""
    if not shared:
        pool = _pool_of(owner, fields)
        if pool is not None:
            return pool.take(shape)
    return _empty(shape, shared)


_distributed_defaults = distributed_defaults


class BatchLoader(IterableDataset):
    """Ready batches of random patches: {field: float32 tensor (B, C, P, P)}, one epoch per iter().

    Built on :class:`patchstore.PatchSampler` (same options, same windows):
    each batch is one C++ gather of B windows for every field, on
    ``num_threads`` threads with the GIL released, straight into a reused
    buffer. No per-sample Python work, no collate, no per-batch allocation.

    path: a store path or a :class:`patchstore.Store`. batch_size: windows
    per batch (B; with patches_per_sample=k, a batch covers B/k sample
    visits). ``len(loader)``: batches per epoch on this rank, the last one
    smaller unless ``drop_last``.

    Epochs: ``set_epoch(e)`` (as with DistributedSampler) makes the next
    iter() yield epoch e; without it each iter() yields the epoch after the
    previous one (0, 1, 2, ...), counted per process. ``epoch``: the epoch
    the next iter() in this process yields.

    rank / world_size: shard of each epoch (as DistributedSampler);
    None takes them from torch.distributed when it is initialised, else 0 / 1.

    Buffers (in the training process): batches are written into a ring of
    ``buffers`` sets of (B, C, P, P) tensors, pinned with ``pin_memory``
    (with a warning and ordinary memory where torch has no pinned
    allocator). A yielded batch is never overwritten while anything still
    refers to it (the batch, one of its tensors or a view of them): a set is
    reused only once the storage use counts show it free, and a new set is
    allocated (with a warning) if all are held. With pinned memory and CUDA,
    a set is refilled only after the work queued on the current CUDA stream
    while it was out has finished (so ``x.cuda(non_blocking=True)`` copies
    of it are done; copies queued on other streams are the caller's to
    synchronise); a set whose copies are done is preferred. So keep at most
    ``buffers - 1`` batches alive (the ``for batch in loader`` loop variable
    holds one), and copy what you keep longer.

    Inside DataLoader workers (``DataLoader(loader, batch_size=None,
    num_workers=N)``): it is an IterableDataset; worker w of N yields
    batches w, w + N, ..., each gathered into fresh shared memory (as torch's
    collate does) since the main process holds it after the worker moves on;
    the DataLoader interleaves them back into the same order, so batches are
    identical to iterating in the training process. Use the DataLoader's
    pin_memory there. Each worker reopens the store (pickled as path and
    options).
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Store],
        fields: Union[str, Sequence[str]],
        patch_size: int,
        batch_size: int,
        patches_per_sample: int = 1,
        require: Optional[str] = None,
        min_valid: float = 1,
        positive_fraction: Optional[float] = None,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        num_threads: int = 1,
        pin_memory: bool = False,
        flip: bool = False,
        rot90: bool = False,
        drop_last: bool = False,
        buffers: int = 2,
    ) -> None:
        super().__init__()
        rank, world_size = _distributed_defaults(rank, world_size)
        self.sampler = PatchSampler(path, fields, patch_size, patches_per_sample, require, min_valid,
                                    positive_fraction, seed, rank, world_size, num_threads, flip=flip, rot90=rot90)
        self.batch_size = operator.index(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"BatchLoader: batch_size must be >= 1, got {batch_size!r}")
        self.buffers = operator.index(buffers)
        if self.buffers < 1:
            raise ValueError(f"BatchLoader: buffers must be >= 1, got {buffers!r}")
        self.pin_memory = bool(pin_memory)
        self.drop_last = bool(drop_last)
        if len(self.sampler) == 0:
            self.sampler._no_windows(self.sampler._s(), "BatchLoader")
        self._epochs = _EpochCounter()
        self._ring: Optional[_Ring] = None
        self._ring_pid = -1
        self._init_resume()

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_ring"] = None
        state["_ring_pid"] = -1
        state["_position"] = None  # each process counts its own iteration
        return state

    # -- description ----------------------------------------------------------------

    @property
    def fields(self) -> Tuple[str, ...]:
        return self.sampler.fields

    @property
    def store(self) -> Store:
        return self.sampler.store

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        w = len(self.sampler)
        return w // self.batch_size if self.drop_last else -(-w // self.batch_size)

    def __repr__(self) -> str:
        o = self.sampler.options
        return (f"BatchLoader('{self.store.path}', fields={list(o['fields'])}, patch_size={o['patch_size']}, "
                f"batch_size={self.batch_size}, patches_per_sample={o['patches_per_sample']}, "
                f"require={o['require']!r}, seed={o['seed']}, rank={o['rank']}, world_size={o['world_size']}, "
                f"epoch={self.epoch}, batches={len(self)})")

    # -- epochs ----------------------------------------------------------------------

    @staticmethod
    def _slot() -> int:
        info = torch.utils.data.get_worker_info()
        return 1 if info is None else 2 + info.id % (_EpochCounter.SLOTS - 2)

    @property
    def epoch(self) -> int:
        """The epoch the next iter() in this process yields."""
        return self._epochs.peek(self._slot())

    def set_epoch(self, epoch: int) -> None:
        """The next iter() (here and in DataLoader workers, persistent or not) yields epoch `epoch`."""
        e = operator.index(epoch)
        if e < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch!r}")
        self._epochs.set(e)
        if self._resume is not None and self._resume[0] != e:
            self._resume = None  # a position restored by load_state_dict holds for its own epoch only

    # -- iteration -------------------------------------------------------------------

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        epoch = self._epochs.take(self._slot())
        nb = len(self)
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        first = w
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] == epoch:
            # A worker state (StatefulDataLoader) gives this worker's own next batch; a training-process
            # state gives the first batch not consumed, which worker w of n reads at offset w.
            first = resume[1] if resume[2] else resume[1] + w
        self._position = [epoch, first, n]
        return self._batches(epoch, range(first, nb, n), shared=info is not None, track=True)

    def batches(self, epoch: int) -> Iterator[Dict[str, torch.Tensor]]:
        """The batches of `epoch` (does not touch the epoch counter)."""
        e = operator.index(epoch)
        if e < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch!r}")
        return self._batches(e, range(len(self)), shared=torch.utils.data.get_worker_info() is not None)

    def _batches(self, epoch: int, which: range, shared: bool,
                 track: bool = False) -> Iterator[Dict[str, torch.Tensor]]:
        s = self.sampler._s()
        total = len(self.sampler)
        B = self.batch_size
        shapes = self.sampler.shapes(B)
        fields = self.fields
        pos = self._position if track else None
        for b in which:
            if pos is not None:
                pos[1] = b + which.step  # counted when handed out: the caller has it
            first = b * B
            n = min(B, total - first)
            if shared:
                out = {f: _empty((n,) + shape[1:], True) for f, shape in shapes.items()}
                s.gather(epoch, first, n, [out[f].numpy() for f in fields])
                yield out
                continue
            slot = self._ring_for(shapes).acquire()
            s.gather(epoch, first, n, [slot.arrays[f][:n] for f in fields])
            yield {f: slot.tensors[f][:n] for f in fields}  # new views: they keep the slot busy

    # -- resuming ----------------------------------------------------------------------

    def _init_resume(self) -> None:
        # This process's iteration: [epoch, next batch, stride] (None before the first iter()).
        self._position: Optional[List[int]] = None
        # (epoch, first batch, worker-local) for the next iter() of that epoch, set by load_state_dict.
        self._resume: Optional[Tuple[int, int, bool]] = None

    def _state_options(self) -> Dict[str, Any]:
        o = self.sampler.options
        return {"seed": int(o["seed"]), "world_size": int(o["world_size"]), "batch_size": self.batch_size,
                "batches": len(self)}

    def state_dict(self, epoch: Optional[int] = None, batch: Optional[int] = None) -> Dict[str, Any]:
        """Where this process stands: {type, version, seed, world_size, batch_size, batches, epoch, batch}.

        Iterated directly (``for batch in loader``), the loader counts the
        batches it handed out: ``epoch`` is the epoch in progress and
        ``batch`` the number of its batches already yielded (the next epoch
        and 0 once an epoch is done), so save it after the training step of
        the last batch. Plain dicts of ints and strings: save it with the
        model checkpoint and pass it to load_state_dict() in the new process.

        Inside DataLoader workers, the training process does not see the
        batches: with torchdata's StatefulDataLoader (which calls
        state_dict() in each worker and load_state_dict() there again) it
        works as is; with a plain DataLoader, give the epoch and the number
        of batches your loop consumed in it: ``state_dict(epoch, step)``.
        The state holds no rank: every rank of a synchronous job is at the
        same position, so one rank's state resumes them all.
        """
        info = torch.utils.data.get_worker_info()
        nb = len(self)
        pos = self._position
        if epoch is not None or batch is not None:
            e = self.epoch if epoch is None else operator.index(epoch)
            b = 0 if batch is None else operator.index(batch)
            if e < 0 or b < 0:
                raise ValueError(f"BatchLoader.state_dict: epoch and batch must be >= 0, got {epoch!r}, {batch!r}")
            worker: Optional[Tuple[int, int]] = None
        elif pos is None:
            e, b = self.epoch, 0 if info is None else info.id
            worker = None if info is None else (info.id, info.num_workers)
        else:
            e, b = pos[0], pos[1]
            worker = None if info is None else (info.id, info.num_workers)
        if b >= nb and worker is None:  # that epoch is done: the start of the next one
            e, b = e + 1, 0
        # (A worker's state keeps its epoch: the DataLoader may not have ended that epoch yet.)
        state: Dict[str, Any] = {"type": "BatchLoader", "version": 1, **self._state_options(), "epoch": e, "batch": b}
        if worker is not None:
            state["worker"], state["num_workers"] = worker
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues a run from a state_dict(): the next iter() yields the rest of the saved epoch (the
        batches after the ones consumed), and later iter() calls the epochs after it, exactly as the
        uninterrupted run would have, here and in DataLoader workers started afterwards (fork or spawn).

        ValueError if the state was saved with another seed, world_size, batch_size or number of
        batches per epoch. Calling ``set_epoch`` with the saved epoch afterwards keeps the position;
        another epoch drops it.
        """
        from ._resume import check_state

        epoch, batch = check_state(state, "BatchLoader", self._state_options())
        info = torch.utils.data.get_worker_info()
        if "worker" in state:
            w, n = state.get("worker"), state.get("num_workers")
            if info is None or (info.id, info.num_workers) != (w, n):
                where = "the training process" if info is None else f"worker {info.id} of {info.num_workers}"
                raise ValueError(f"BatchLoader.load_state_dict: this state was saved in DataLoader worker {w} of "
                                 f"{n} (by torchdata's StatefulDataLoader); it cannot be loaded in {where}")
            slot = self._slot()
            a = self._epochs._shared
            a[slot] = epoch - int(a[0])  # this worker's next iter() yields `epoch`, later ones the following
            self._resume = (epoch, batch, True)
            return
        self._epochs.set(epoch)
        self._resume = (epoch, batch, False) if batch else None

    def _ring_for(self, shapes: Dict[str, Tuple[int, ...]]) -> _Ring:
        if self._ring is None or self._ring_pid != os.getpid():
            self._ring = _Ring(shapes, self.buffers, self.pin_memory, "patchstore.torch.BatchLoader")
            self._ring_pid = os.getpid()
        return self._ring


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
            from ._sampler import _best_window
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


def collate(batch: List[Any]) -> Any:
    """Collates PatchDataset items, flattening the k patches of each item into the batch.

    (Tuple items, as SliceDataset's, are collated by :func:`slice_collate`.)

    Items {field: (k, C, P, P)} become {field: (B*k, C, P, P)} (the seed's
    torch.cat collate); items {field: (C, P, P)} (k == 1) become (B, C, P, P).
    When the items come from PatchDataset's batched fetch (DataLoader calls
    __getitems__), their patches already lie back to back in one tensor and
    that tensor is returned without a copy. Anything else is collated by
    torch's default_collate (in shared memory inside workers), then flattened.
    """
    if not batch:
        return {}
    if isinstance(batch[0], tuple):
        return slice_collate(batch)
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


def slice_collate(batch: List[Tuple[Any, ...]]) -> Tuple[Any, ...]:
    """Collates SliceDataset items (tuples of tensors) into a tuple of batches.

    Items (MR, CT, MASK), each (2c+1, H, W), become ((B, 2c+1, H, W), ...).
    When the items come from SliceDataset's batched fetch (DataLoader calls
    __getitems__), each field's stacks already lie back to back in one tensor
    (in shared memory inside a worker) and that tensor is passed through
    without a copy. Anything else is stacked by torch's default_collate.
    """
    if not batch:
        return ()
    if not isinstance(batch[0], tuple):
        return default_collate(batch)
    out = []
    for k in range(len(batch[0])):
        values = [item[k] for item in batch]
        joined = _consecutive(values)
        if joined is None:
            shapes = sorted({tuple(v.shape) for v in values if isinstance(v, torch.Tensor)})
            if len(shapes) > 1:
                raise ValueError(f"slice_collate: the items of this batch have {len(shapes)} different shapes "
                                 f"({', '.join(str(x) for x in shapes[:4])}{', ...' if len(shapes) > 4 else ''}): "
                                 f"their volumes have slices of different sizes; give SliceDataset a crop=(h, w) "
                                 f"no larger than the smallest slice")
        out.append(default_collate(values) if joined is None else joined)
    return tuple(out)


def _clamps(clamp: Any, fields: Tuple[str, ...]) -> Dict[str, Tuple[float, float]]:
    """clamp=None | (lo, hi) for every field | {field: (lo, hi)} -> {field: (lo, hi)}."""
    if clamp is None:
        return {}
    if isinstance(clamp, dict):
        extra = [f for f in clamp if f not in fields]
        if extra:
            raise ValueError(f"SliceDataset: clamp names fields {extra} that are not among fields {list(fields)}")
        pairs = dict(clamp)
    else:
        pairs = {f: clamp for f in fields}
    out = {}
    for f, v in pairs.items():
        if v is None:
            continue
        try:
            lo, hi = (float(x) for x in v)
        except (TypeError, ValueError):
            raise ValueError(f"SliceDataset: clamp for '{f}' must be (lo, hi), got {v!r}") from None
        if not lo <= hi:
            raise ValueError(f"SliceDataset: clamp for '{f}' has lo > hi: {v!r}")
        out[f] = (lo, hi)
    return out


_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """SplitMix64's finaliser on a Python int (patchstore._volumes._mix, one value)."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _slice_transform_row(seed: int, epoch: int, i: int, H: int, W: int, crop: Optional[Tuple[int, int]],
                         flip: Union[bool, str], rot90: bool) -> List[int]:
    """draw_transforms(seed, epoch, [i], [H], [W], crop, flip, rot90)[0] with Python ints (one item)."""
    key = _mix64(seed & _M64)
    for part in (epoch, i, 0x534C4943):  # _volumes._SLICE_TAG
        key = _mix64(key ^ (part & _M64))
    row = [0] * 7
    if crop is not None:
        ch, cw = crop
        row[0] = ((_mix64(key ^ 1) >> 32) * (H - ch + 1)) >> 32
        row[1] = ((_mix64(key ^ 2) >> 32) * (W - cw + 1)) >> 32
        row[2], row[3] = ch, cw
    if flip:
        u = _mix64(key ^ 3)
        row[4] = u & 1
        row[5] = (u >> 1) & 1 if flip == "independent" else u & 1
    if rot90:
        v = _mix64(key ^ 4)
        row[6] = (1 + (((v >> 32) * 3) >> 32)) if v & 1 else 0
    return row


class _SliceItemPlan:
    """What SliceDataset.__getitem__ needs, as plain Python values, built once per process."""

    __slots__ = ("pid", "n", "firsts", "volumes", "reader", "fields", "depth", "augment", "identity")

    def __init__(self, ds: "SliceDataset") -> None:
        ix = ds.index
        self.pid = os.getpid()
        self.n = len(ix)
        self.firsts = [ix.first(v) for v in range(ix.volume_count)]
        self.volumes = []
        for v in range(ix.volume_count):
            _, H, W = ix.shape(v)
            self.volumes.append((ix.sample(v), H, W))
        self.reader = ds.store._r()
        self.fields = list(ds.fields)
        self.depth = 2 * ds.context + 1
        self.augment = ds.crop is not None or bool(ds.flip) or ds.rot90
        self.identity = np.zeros((1, 7), dtype=np.int64)  # no crop, flip or turn (read only)
        self.identity.setflags(write=False)


class SliceDataset(ResumableDataset, Dataset):
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

    Augmentation (the seed's MONAI transforms), the same for every field of
    an item and for every slice of its stack:

    * ``flip=True``: with probability 1/2 flip both spatial axes, as
      ``RandFlipd(prob=0.5, spatial_axis=[0, 1])`` does (which is a 180
      degree turn); ``flip="independent"``: flip the rows and the columns
      each with probability 1/2 (all four mirror images equally likely).
    * ``rot90=True``: with probability 1/2 turn by k quarter turns, k
      uniform in {1, 2, 3}, as ``RandRotate90d(prob=0.5, max_k=3)``
      (``np.rot90(a, k, axes=(-2, -1))``). Odd turns swap height and width,
      so rot90 needs square output planes (a square crop or square slices).
    * ``clamp=(lo, hi)``: values clipped to [lo, hi] (as the seed's
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

    ids: a list (or other sequence) of volume ids, in that order; a single
    string is a TypeError and an empty list a ValueError. Volumes whose
    slices differ in size need ``crop`` to be batched (warned here;
    :func:`slice_collate` says so when a batch mixes them).

    Processes: pickles as the store path and the options (fork, spawn and
    forkserver workers); each process reopens the store and rebuilds the
    slice index (one header read per record).

    Errors: KeyError for an unknown field or id, ValueError for bad options,
    a store of images (kind "frames"), a crop larger than a volume's slices
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
        self._saturated: Dict[str, float] = {}  # fields already warned about in this process
        t = operator.index(num_threads)
        self.num_threads = (os.cpu_count() or 1) if t == 0 else t
        if self.num_threads < 1:
            raise ValueError(f"SliceDataset: num_threads must be >= 1 (or 0 for all cores), got {num_threads!r}")
        self.index = self.store.slice_index(ids)  # ValueError here for bad volumes
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
        e = operator.index(epoch)
        if e < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch!r}")
        self._epoch.value = e

    # -- description --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.index)

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

    def ref(self, i: int) -> SliceRef:
        """(volume id, slice) of item i."""
        return self.index[i]

    def _plan(self, idx: np.ndarray, epoch: Optional[int]) -> Tuple[np.ndarray, np.ndarray]:
        """(rows (n, 5): sample, slice, depth, H, W; transforms (n, 7)) of normalised indices."""
        rows = self.index._lookup(idx)
        e = self.epoch if epoch is None else operator.index(epoch)
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
        dataset calls: plain-int lookups (no NumPy round trips), the transform drawn with Python ints,
        reused request arrays and one C++ copy per item (see bench/python_item_bench.py).
        """
        plan = self._item_plan()
        n = plan.n
        j = operator.index(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"SliceDataset index {i} out of range [0, {n}) for '{self.store.path}'")
        v = bisect.bisect_right(plan.firsts, j) - 1
        sample, H, W = plan.volumes[v]
        refs = np.array([[sample, j - plan.firsts[v]]], dtype=np.int64)  # per call: threads may share ds
        if plan.augment:
            row = _slice_transform_row(self.seed, self.epoch, j, H, W, self.crop, self.flip, self.rot90)
            tr = np.array([row], dtype=np.int64)
            h, w = (row[2], row[3]) if self.crop is not None else (H, W)
            if row[6] % 2:
                h, w = w, h
        else:
            tr, (h, w) = plan.identity, (H, W)
        nf = len(plan.fields)
        if torch.utils.data.get_worker_info() is None:
            # One allocation for all fields; the items are views of it (as __getitems__'s are of the batch).
            buf = np.empty((nf, 1, plan.depth, h, w), dtype=np.float32)
            _C.copy_slice_stacks(plan.reader, refs, tr, plan.fields, self.context, list(buf), 1)
            out = torch.from_numpy(buf.reshape(nf, plan.depth, h, w)).unbind(0)
        else:  # in shared memory, which the worker hands to the training process without a copy
            out = tuple(_empty((plan.depth, h, w), True) for _ in plan.fields)
            _C.copy_slice_stacks(plan.reader, refs, tr, plan.fields, self.context, [t.numpy()[None] for t in out],
                                 1)
        for f, t in zip(self.fields, out):
            c = self.clamp.get(f)
            if c is not None:
                t.clamp_(c[0], c[1])
        return out

    def _item_plan(self) -> "_SliceItemPlan":
        plan = getattr(self, "_plan_cache", None)
        if plan is None or plan.pid != os.getpid():
            plan = _SliceItemPlan(self)
            self._plan_cache = plan
        return plan

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_plan_cache", None)  # per process
        state.pop("_pool", None)  # batch buffers belong to the process that made them
        return state

    def __getitems__(self, indices: Sequence[int]) -> List[Tuple[torch.Tensor, ...]]:
        """Items for a whole batch of indices (used by DataLoader's fetcher): one C++ copy per field."""
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
        reader = self.store._r()
        depth = 2 * self.context + 1
        items: List[Optional[Tuple[torch.Tensor, ...]]] = [None] * n
        shapes = np.stack([oh, ow], axis=1)
        groups = [np.arange(n)] if (shapes == shapes[0]).all() else [
            np.flatnonzero((shapes == s).all(axis=1)) for s in np.unique(shapes, axis=0)]
        for g in groups:
            h, w = int(oh[g[0]]), int(ow[g[0]])
            batch = [_batch_tensor(self, (len(g), depth, h, w), shared, len(self.fields)) for _ in self.fields]
            refs = np.ascontiguousarray(rows[g][:, :2])
            _C.copy_slice_stacks(reader, refs, np.ascontiguousarray(tr[g]), list(self.fields), self.context,
                                 [t.numpy() for t in batch], self.num_threads)
            for f, t in zip(self.fields, batch):
                if f in self.clamp:
                    lo, hi = self.clamp[f]
                    self._check_saturation(f, t, lo, hi)
                    t.clamp_(lo, hi)
            for j, b in enumerate(g):
                items[int(b)] = tuple(t[j] for t in batch)
        return items  # type: ignore[return-value]
