"""Helpers shared by the datasets of patchstore.torch: shared epoch counters, batch buffer rings and pools,
shared-memory tensors. Private to the package."""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.context
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from .._resume import distributed_defaults


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

    def __init__(self, shapes: Mapping[str, Tuple[int, ...]], count: int, pin: bool, owner: str,
                 dtypes: Optional[Mapping[str, torch.dtype]] = None) -> None:
        self.shapes, self.count, self.pin, self.owner = shapes, count, pin, owner
        self.dtypes = dict(dtypes or {})  # per field; float32 where absent
        self.slots: List[_Slot] = []
        self.next = 0
        self.warned = False
        self.cuda = False
        self.last: Optional[_Slot] = None

    def _allocate(self) -> _Slot:
        tensors = {}
        for f, shape in self.shapes.items():
            t = None
            dtype = self.dtypes.get(f, torch.float32)
            if self.pin:
                try:
                    t = torch.empty(shape, dtype=dtype, pin_memory=True)
                    self.cuda = torch.cuda.is_available() and t.is_pinned()
                except RuntimeError as e:  # CPU-only torch: no pinned allocator
                    warnings.warn(f"patchstore.torch.BatchLoader: pin_memory=True but pinned memory is not "
                                  f"available ({e}); using ordinary memory", RuntimeWarning, stacklevel=4)
                    self.pin = False
            if t is None:
                t = torch.empty(shape, dtype=dtype)
            tensors[f] = t
        return _Slot(tensors)

    def acquire(self) -> _Slot:
        if self.cuda and self.last is not None:
            # Copies of the previous batch that the caller queued since it was
            # handed out (x.cuda(non_blocking=True)) must finish before its
            # buffer is refilled.
            try:
                self.last.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
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

    def take(self, shape: Tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.pid != os.getpid():  # forked: the parent's buffers are not ours to reuse
            self.bufs, self.pid = [], os.getpid()
        n = int(np.prod(shape))
        best = -1
        for j, (b, idle) in enumerate(self.bufs):
            if (b.dtype == dtype and b.numel() >= n and (best < 0 or b.numel() < self.bufs[best][0].numel())
                    and self._uses(b) == idle):
                best = j
        if best >= 0:
            return self.bufs[best][0][:n].view(shape)
        flat = torch.empty(max(n, 1), dtype=dtype)
        flat_idle = self._uses(flat)
        if flat_idle is not None:
            if len(self.bufs) < self.keep:
                self.bufs.append((flat, flat_idle))
            else:  # replace the smallest free buffer, if any (keeps the pool at `keep`)
                free = [j for j, (b, i) in enumerate(self.bufs) if self._uses(b) == i]
                if free:
                    self.bufs[min(free, key=lambda j: self.bufs[j][0].numel())] = (flat, flat_idle)
        return flat[:n].view(shape)


def _pool_of(owner: Any, fields: int) -> Optional[_BufferPool]:
    """The owner's buffer pool (created on first use, never pickled); None when pooling is off."""
    if not _POOL_BATCH_BUFFERS:
        return None
    pool: Optional[_BufferPool] = owner.__dict__.get("_pool")
    if pool is None:
        pool = owner.__dict__["_pool"] = _BufferPool(3 * max(1, fields))
    return pool


# Reuse batch buffers in the training process (see _BufferPool). Only the
# benchmarks switch this off, to measure the per-batch allocation it replaces.
_POOL_BATCH_BUFFERS = True


def _batch_tensor(owner: Any, shape: Tuple[int, ...], shared: bool, fields: int,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A batch tensor (float32, or a stored dtype): fresh shared memory inside a DataLoader worker, a pooled
    buffer otherwise."""
    if not shared:
        pool = _pool_of(owner, fields)
        if pool is not None:
            return pool.take(shape, dtype)
    return _empty(shape, shared, dtype)


_distributed_defaults = distributed_defaults


def _empty(shape: Tuple[int, ...], shared: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor (float32 by default), in shared memory when `shared` (as default_collate does in workers)."""
    if shared:
        try:
            proto = torch.empty(0, dtype=dtype)
            storage = proto._typed_storage()._new_shared(  # type: ignore[no-untyped-call]
                int(np.prod(shape)), device=proto.device)
            return proto.new(storage).resize_(*shape)
        except (AttributeError, RuntimeError, TypeError):  # private API moved: plain memory
            pass
    return torch.empty(shape, dtype=dtype)
