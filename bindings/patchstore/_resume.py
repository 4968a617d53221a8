"""Resuming an epoch where it stopped: state_dict() / load_state_dict() for patchstore.torch.

Every window and every slice transform is a function of (seed, epoch,
position), so the state of a loader is two integers: the epoch in progress
and how many of its batches the training loop has consumed, plus the
options they are relative to (checked on load). States are plain dicts of
ints and strings: small, picklable, JSON-able, saved with the model
checkpoint.

Map-style datasets (PatchDataset, SliceDataset) do not choose their order:
the sampler does. ``dataset.batch_sampler(batch_size, shuffle=True)`` gives
a batch sampler whose order is a function of (seed, epoch, rank,
world_size) and which starts the epoch restored by ``load_state_dict`` at
the batch after the last one consumed. torchdata's StatefulDataLoader
keeps the sampler position itself and saves the dataset state (its epoch)
from each worker; both ways work.
"""

from __future__ import annotations

import operator
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import _patchstore as _C
from ._config import UNSET

# Version 2: the epoch order of EpochBatchSampler comes from the samplers' C++
# generator (splitmix::Shuffle, salt 'EBS1'), no longer from NumPy's bit generator, and
# PatchDataset's items are its eligible samples; a version-1 position would
# resume into a different order, so it is refused.
STATE_VERSION = 2
_ORDER_SALT = 0x45425331  # 'EBS1'
# Keys added to version-2 states later, with the value a state saved before them stands for.
# A state holds them only when they differ from these (so random-order states are unchanged).
_STATE_DEFAULTS: Dict[str, Any] = {"order": "random", "cache_budget": 0}


def order_keys(order: str, cache_budget: int) -> Dict[str, Any]:
    """The order settings a state records: {} for the random order, else {order, cache_budget}."""
    if (order, int(cache_budget or 0)) == (_STATE_DEFAULTS["order"], _STATE_DEFAULTS["cache_budget"]):
        return {}
    return {"order": order, "cache_budget": int(cache_budget or 0)}


def _int(state: Dict[str, Any], key: str, what: str) -> int:
    try:
        v = state[key]
    except KeyError:
        raise ValueError(f"{what}.load_state_dict: the state has no '{key}' (keys: {sorted(state)})") from None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{what}.load_state_dict: '{key}' must be an int, got {v!r}")
    return int(v)


def check_state(state: Any, what: str, expect: Dict[str, Any]) -> Tuple[int, int]:
    """(epoch, batch) of a state saved by `what`, after checking it matches `expect` (the loader's options)."""
    if not isinstance(state, dict):
        raise TypeError(f"{what}.load_state_dict: expected the dict returned by state_dict(), got "
                        f"{type(state).__name__}")
    if state.get("type") != what:
        raise ValueError(f"{what}.load_state_dict: this state was saved by {state.get('type')!r}, not {what}")
    if _int(state, "version", what) == 1:
        raise ValueError(f"{what}.load_state_dict: this state (version 1) was saved by an older patchstore whose "
                         f"epoch order differs; resuming from it would repeat or skip items. Start the epoch "
                         f"again: set_epoch({state.get('epoch')!r}) without load_state_dict")
    if _int(state, "version", what) != STATE_VERSION:
        raise ValueError(f"{what}.load_state_dict: state version {state['version']} is not supported "
                         f"(this patchstore reads version {STATE_VERSION})")
    for key, want in expect.items():
        got = state.get(key, _STATE_DEFAULTS.get(key))
        if got != want:
            raise ValueError(f"{what}.load_state_dict: the state was saved with {key}={got!r}, this {what} has "
                             f"{key}={want!r}; build it with the options of the run being resumed")
    from ._sampler_options import _position
    epoch, batch = _int(state, "epoch", what), _int(state, "batch", what)
    return (_position(epoch, "epoch", f"{what}.load_state_dict: "),
            _position(batch, "batch", f"{what}.load_state_dict: "))


def distributed_defaults(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """rank/world_size as given, else torch.distributed's when it is initialised, else (0, 1)."""
    import torch

    dist = getattr(torch, "distributed", None)
    active = dist is not None and dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if active else 0
    if world_size is None:
        world_size = dist.get_world_size() if active else 1
    return operator.index(rank), operator.index(world_size)


def distributed(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    rank, world_size = distributed_defaults(rank, world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size) and world_size >= 1, got rank={rank} "
                         f"world_size={world_size}")
    return rank, world_size


class ResumableDataset:
    """state_dict() / load_state_dict() / batch_sampler() of a map-style patchstore Dataset (mixin).

    The class provides `seed`, `epoch`, `set_epoch` and `__len__`; states are tagged with its name.
    """

    @property
    def _state_type(self) -> str:
        return type(self).__name__
    # (epoch, first batch, order, cache_budget) restored by load_state_dict, for the next epoch
    # `epoch` of batch_sampler() (which checks that its order is the state's).
    _resume_at: Optional[Tuple[int, int, str, int]] = None
    # (order, cache_budget) of the last batch_sampler() made: what state_dict() records.
    _batch_order: Tuple[str, int] = ("random", 0)

    def _locality_items(self) -> Tuple[np.ndarray, np.ndarray]:
        """(items in storage order, the record bytes each reads): what order='locality' cuts into blocks."""
        raise NotImplementedError(f"{type(self).__name__} has no locality order")

    def state_dict(self, batch: int = 0) -> Dict[str, Any]:
        """The position to resume from: {type, version, seed, length, epoch, batch} (and order,
        cache_budget for order="locality").

        `batch`: how many batches of the current epoch (``self.epoch``) the
        training loop has consumed (its step within the epoch; 0 at an epoch
        start). The dataset cannot count them itself: a DataLoader fetches
        ahead of the loop. (torchdata's StatefulDataLoader calls state_dict()
        in its workers for the epoch, and keeps the batch count itself.)
        order / cache_budget: those of the last ``batch_sampler()`` made
        (the order the batch count refers to).
        """
        from ._sampler_options import _position
        b = _position(batch, "batch", f"{self._state_type}.state_dict: ")
        order, budget = self._batch_order
        return {"type": self._state_type, "version": STATE_VERSION, "seed": int(self.seed),
                "length": len(self), **order_keys(order, budget), "epoch": int(self.epoch), "batch": b}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores a state_dict(): sets the epoch, and makes the next epoch of ``batch_sampler()``
        (if it is that epoch) start after the consumed batches."""
        epoch, batch = check_state(state, self._state_type, {"seed": int(self.seed), "length": len(self)})
        self.set_epoch(epoch)
        order = state.get("order", _STATE_DEFAULTS["order"])
        budget = state.get("cache_budget", _STATE_DEFAULTS["cache_budget"])
        self._batch_order = (order, budget)
        self._resume_at = (epoch, batch, order, budget) if batch else None

    def batch_sampler(self, batch_size: int, shuffle: bool = True, drop_last: bool = False,
                      rank: Optional[int] = None, world_size: Optional[int] = None, *, order: Any = UNSET,
                      cache_budget: Any = UNSET) -> "EpochBatchSampler":
        """A batch sampler for ``DataLoader(dataset, batch_sampler=...)`` that resumes mid-epoch.

        See :class:`EpochBatchSampler` (order="locality" with cache_budget: blocks of storage order).
        """
        return EpochBatchSampler(self, batch_size, shuffle, drop_last, rank, world_size, order=order,
                                 cache_budget=cache_budget)


class EpochBatchSampler:
    """Batches of indices of a patchstore map-style dataset, in an order that depends only on
    (dataset seed, epoch, rank, world_size), resumable mid-epoch.

    Each iter() yields the batches of the dataset's current epoch
    (``dataset.set_epoch``): a permutation of range(len(dataset)) drawn from
    (seed, epoch) (or the identity with ``shuffle=False``), split over ranks
    as torch's DistributedSampler does (rank r takes positions r, r + W,
    ...; the permutation is padded by wrapping around to a multiple of W, or
    cut with ``drop_last``), then cut into batches of `batch_size` (the last
    smaller unless ``drop_last``). rank / world_size: None takes them from
    torch.distributed when initialised, else 0 / 1.

    order="locality" with cache_budget (bytes or "8GB"), for stores larger
    than the page cache: the permutation visits the items in shuffled blocks
    of storage order whose record bytes fit cache_budget / 2, shuffled
    inside each block (C++ reader/order.h, the same engine as PatchSampler's
    order="locality"); split over ranks as above, so every item is still
    read once per epoch across ranks. Needs shuffle=True.

    After ``dataset.load_state_dict(state)``, the first iter() over the
    state's epoch starts at its batch ``state["batch"]``; later epochs start
    at 0. It runs in the training process (DataLoader iterates the sampler
    there), so any number of workers and any start method give the same
    batches.
    """

    def __init__(self, dataset: ResumableDataset, batch_size: int, shuffle: bool = True, drop_last: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None, *, order: Any = UNSET,
                 cache_budget: Any = UNSET) -> None:
        from ._sampler_options import order_options

        self.order_name, self.cache_budget = order_options(order, cache_budget, "batch_sampler")
        if self.order_name == "locality" and not shuffle:
            raise ValueError("batch_sampler: order='locality' shuffles; it needs shuffle=True")
        dataset._batch_order = (self.order_name, self.cache_budget)
        self.dataset = dataset
        self.batch_size = operator.index(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_sampler: batch_size must be >= 1, got {batch_size!r}")
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.rank, self.world_size = distributed(rank, world_size)

    def _mine(self) -> int:
        n, w = len(self.dataset), self.world_size
        return n // w if self.drop_last else -(-n // w)

    def __len__(self) -> int:
        m = self._mine()
        return m // self.batch_size if self.drop_last else -(-m // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The indices this rank reads in `epoch`, in order (before cutting into batches)."""
        n, w = len(self.dataset), self.world_size
        if self.shuffle and self.order_name == "locality":
            items, nbytes = self.dataset._locality_items()
            pos = np.frombuffer(_C.locality_order(np.ascontiguousarray(nbytes, dtype=np.uint64), self.cache_budget,
                                                  int(self.dataset.seed) & 0xFFFFFFFFFFFFFFFF, epoch),
                                dtype=np.uint64).astype(np.int64)
            perm = np.asarray(items, dtype=np.int64)[pos]
        elif self.shuffle:
            perm = np.arange(n, dtype=np.int64)
            _C.shuffle(perm, int(self.dataset.seed) & 0xFFFFFFFFFFFFFFFF, epoch, _ORDER_SALT)
        else:
            perm = np.arange(n, dtype=np.int64)
        total = self._mine() * w
        if total > n:
            perm = np.resize(perm, total)  # wraps around, as DistributedSampler pads
        return perm[:total][self.rank::w]

    def batches(self, epoch: int, start: int = 0) -> Iterator[List[int]]:
        """The batches of `epoch` from batch `start` (does not touch the resume position)."""
        from ._sampler_options import _position
        mine = self.order(_position(epoch, "epoch"))
        B = self.batch_size
        for b in range(operator.index(start), len(self)):
            yield mine[b * B:(b + 1) * B].tolist()

    def __iter__(self) -> Iterator[List[int]]:
        # A generator: the epoch and the resume position are read at the first next(), not by iter()
        # (DataLoader calls iter() on its sampler twice when it starts, and drops the first iterator).
        ds = self.dataset
        epoch = int(ds.epoch)
        start = 0
        at = ds._resume_at
        if at is not None:
            ds._resume_at = None  # once: later passes over the epoch start at 0
            if at[0] == epoch:
                if (at[2], int(at[3] or 0)) != (self.order_name, self.cache_budget):
                    raise ValueError(f"{type(ds).__name__}.batch_sampler: the loaded state was saved with "
                                     f"order={at[2]!r}, cache_budget={at[3]!r}; this batch sampler has "
                                     f"order={self.order_name!r}, cache_budget={self.cache_budget!r}: its "
                                     f"batches would not continue that epoch")
                start = at[1]
        yield from self.batches(epoch, start)

    def __repr__(self) -> str:
        return (f"EpochBatchSampler(batch_size={self.batch_size}, shuffle={self.shuffle}, order={self.order_name!r}, "
                f"drop_last={self.drop_last}, rank={self.rank}, world_size={self.world_size}, batches={len(self)})")
