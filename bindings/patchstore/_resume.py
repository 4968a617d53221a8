"""Resuming an epoch where it stopped: state_dict() / load_state_dict() for patchstore.torch.

Every window and every slice transform is a function of (seed, epoch,
position), so the state of a loader is two integers: the epoch in progress
and how many of its batches the training loop has consumed, plus what they
are relative to, checked on load: under "options" every option that changes
what is served (fields, patch size, k, require, min_valid,
positive_fraction, policy, flips, rot90, crop, context, clamp, ids, seed,
world_size, batch size, order, cache_budget; not num_threads, prefetch, index_cache_bytes or
rank: every rank of a synchronous job is at the same position, so one
rank's state resumes them all), and under "store" the store's identity
(``Reader.identity()``: a hash of the sample ids in index order, each
record's logical shape and mask valid count and the field names, computed
in C++ from the store's index without reading a record; pixels are not
hashed, so a re-laid-out or re-encoded copy of the store has the same
identity). load_state_dict() refuses a state whose options or store differ,
naming the option and both values. States are plain dicts of ints, floats,
strings and lists: small, picklable, JSON-able, saved with the model
checkpoint. States saved before options were recorded (version 2) still
load; they checked only seed, world_size, batch counts and order.

Map-style datasets (PatchDataset, SliceDataset) do not choose their order:
the sampler does. ``dataset.batch_sampler(batch_size, shuffle=True)`` gives
a batch sampler whose order is a function of (seed, epoch, rank,
world_size) and which starts the epoch restored by ``load_state_dict`` at
the batch after the last one consumed. torchdata's StatefulDataLoader
keeps the sampler position itself and saves the dataset state (its epoch)
from each worker; both ways work. Any other sampler (``DataLoader(ds,
shuffle=True)``) cannot resume mid-epoch: state_dict(batch > 0) without a
batch_sampler() is refused, and after load_state_dict of a mid-epoch state,
reading items of that epoch before the dataset's batch sampler took the
position raises (in the training process and in DataLoader workers) instead
of serving a different, full epoch.
"""

from __future__ import annotations

import hashlib
import json
import operator
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from . import _patchstore as _C
from ._config import UNSET

if TYPE_CHECKING:
    from ._store import Store

# Version 2: the epoch order of EpochBatchSampler comes from the samplers' C++
# generator (splitmix::Shuffle, salt 'EBS1'), no longer from NumPy's bit generator, and
# PatchDataset's items are its eligible samples; a version-1 position would
# resume into a different order, so it is refused.
# Version 3: the state records the served options ("options") and the store's identity ("store").
# Version-2 states still load, checked against seed, world_size, batch counts and order only.
STATE_VERSION = 3
_LEGACY_VERSION = 2
_ORDER_SALT = 0x45425331  # 'EBS1'
# Keys added to version-2 states later, with the value a state saved before them stands for.
# A state holds them only when they differ from these (so random-order states are unchanged).
_STATE_DEFAULTS: Dict[str, Any] = {"order": "random", "cache_budget": 0}


# What loaders keep that does not change what they serve: left out of states. rank: one rank's state
# resumes every rank of a synchronous job (all are at the same position).
_NOT_SERVED = frozenset({"num_threads", "prefetch", "rank", "verify_checksums", "cache_size", "clamp_warn",
                         "index_cache_bytes"})
# Lists longer than this (ids, a subset) are recorded as "<n> ids #<hash>", keeping states small.
_LIST_LIMIT = 8


def _jsonable(key: str, v: Any) -> Any:
    if isinstance(v, (bool, str)) or v is None:
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, Mapping):
        return {str(k): _jsonable(key, x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple, np.ndarray)):
        items = [_jsonable(key, x) for x in v]
        if key == "ids" and len(items) > _LIST_LIMIT:
            digest = hashlib.sha1(json.dumps(items).encode()).hexdigest()[:12]
            return f"{len(items)} {key} #{digest}"
        return items
    return repr(v)


def recorded_options(kept: Mapping[str, Any], drop: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """The options a state records, derived from what a loader keeps (its checked options): every one
    that changes what is served, as JSON-able values (tuples as lists, a long ids list as its count
    and hash), sorted by name. Left out: _NOT_SERVED and `drop` (options that live elsewhere, e.g. a
    dataset's order, which its batch sampler has)."""
    return {k: _jsonable(k, v) for k, v in sorted(kept.items()) if k not in _NOT_SERVED and k not in drop}


def store_identity(loader: Any, store: Any) -> str:
    """The store's identity (Reader.identity(), see the module docstring), cached on `loader`."""
    sid: Optional[str] = loader.__dict__.get("_store_identity")
    if sid is None:
        from ._store import reader_of

        sid = reader_of(store).identity()
        loader.__dict__["_store_identity"] = sid
    return sid


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


def _unset(v: Any) -> str:
    return "(not recorded)" if v is _MISSING else f"{v!r}"


_MISSING = object()


def check_state(state: Any, what: str, legacy: Dict[str, Any], options: Optional[Dict[str, Any]] = None,
                store: Optional[str] = None, store_path: str = "") -> Tuple[int, int]:
    """(epoch, batch) of a state saved by `what`, after checking it matches this loader.

    A current state (version 3) is checked against `options` (recorded_options of the loader), the
    store identity `store`, then the counts in `legacy` that a state holds at its top level (length or
    batches); a version-2 state (before options were recorded) against `legacy` only (its top-level
    keys: seed, world_size, batch counts, order).
    """
    if not isinstance(state, dict):
        raise TypeError(f"{what}.load_state_dict: expected the dict returned by state_dict(), got "
                        f"{type(state).__name__}")
    if state.get("type") != what:
        raise ValueError(f"{what}.load_state_dict: this state was saved by {state.get('type')!r}, not {what}")
    version = _int(state, "version", what)
    if version == 1:
        raise ValueError(f"{what}.load_state_dict: this state (version 1) was saved by an older patchstore whose "
                         f"epoch order differs; resuming from it would repeat or skip items. Start the epoch "
                         f"again: set_epoch({state.get('epoch')!r}) without load_state_dict")
    if version not in (_LEGACY_VERSION, STATE_VERSION):
        raise ValueError(f"{what}.load_state_dict: state version {state['version']} is not supported "
                         f"(this patchstore reads versions {_LEGACY_VERSION} and {STATE_VERSION})")
    hint = "; build it with the options of the run being resumed"
    if version == _LEGACY_VERSION:
        newer = sorted({"options", "store", "batch_sampler"} & set(state))
        if newer:  # a current state whose version was changed: its options would go unchecked
            raise ValueError(f"{what}.load_state_dict: the state says version {_LEGACY_VERSION} but holds "
                             f"{', '.join(repr(k) for k in newer)}, which only version-{STATE_VERSION} states hold "
                             f"(states this patchstore saves are version {STATE_VERSION}); load the state as "
                             f"state_dict() saved it")
        missing = sorted(k for k in legacy if k not in state and k not in _STATE_DEFAULTS)
        if missing:
            raise ValueError(f"{what}.load_state_dict: this version-{_LEGACY_VERSION} state has no "
                             f"{', '.join(repr(k) for k in missing)} (keys: {sorted(state)}); a version-"
                             f"{_LEGACY_VERSION} state of a {what} holds {sorted(legacy)}")
    if version == STATE_VERSION:
        saved = state.get("options")
        if not isinstance(saved, dict):
            raise ValueError(f"{what}.load_state_dict: this version-{version} state has no 'options' dict "
                             f"(keys: {sorted(state)})")
        for key in sorted(set(saved) | set(options or {}), key=lambda k: (k == "cache_budget", k)):  # order first
            got, want = saved.get(key, _MISSING), (options or {}).get(key, _MISSING)
            if got != want:
                raise ValueError(f"{what}.load_state_dict: the state was saved with {key}={_unset(got)}, this "
                                 f"{what} has {key}={_unset(want)}{hint}")
        if state.get("store") != store:
            raise ValueError(f"{what}.load_state_dict: the state was saved from another store (identity "
                             f"{state.get('store')!r}); this {what} reads '{store_path}' (identity {store!r}): "
                             f"other sample ids, shapes or mask counts. Resume on the store the run used")
        legacy = {k: v for k, v in legacy.items() if k in ("length", "batches")}
    for key, want in legacy.items():
        got = state.get(key, _STATE_DEFAULTS.get(key))
        if got != want:
            raise ValueError(f"{what}.load_state_dict: the state was saved with {key}={got!r}, this {what} has "
                             f"{key}={want!r}{hint}")
    from ._sampler_options import _position
    epoch, batch = _int(state, "epoch", what), _int(state, "batch", what)
    return (_position(epoch, "epoch", f"{what}.load_state_dict: "),
            _position(batch, "batch", f"{what}.load_state_dict: "))


def rank_items(length: int, world_size: int, drop_last: bool) -> int:
    """Items per epoch on one rank of an EpochBatchSampler: `length` split over `world_size` ranks (padded by
    wrapping around, or cut with drop_last)."""
    return length // world_size if drop_last else -(-length // world_size)


def epoch_batches(length: int, batch_size: int, world_size: int, drop_last: bool) -> int:
    """Batches per epoch on one rank of an EpochBatchSampler: its rank_items cut into batches of `batch_size`."""
    mine = rank_items(length, world_size, drop_last)
    return mine // batch_size if drop_last else -(-mine // batch_size)


def past_the_end(where: str, what: str, batch: int, batches: int, epoch: int) -> ValueError:
    """The refusal of a state whose batch lies past the end of its epoch (batch == batches is its end)."""
    return ValueError(f"{where}: batch={batch} is past the end of epoch {epoch}: an epoch of {what} has {batches} "
                      f"batches (batch {batches} is the end of the epoch)")


def _sampler_batches(sampler: Dict[str, Any], length: int) -> Optional[int]:
    """Batches per epoch of the batch sampler a dataset state records, or None when the state does not say
    (a version-2 state, or values that are not counts: the batch sampler's own check names them)."""
    try:
        b, w, d = sampler["batch_size"], sampler["world_size"], sampler["drop_last"]
    except KeyError:
        return None
    if not (all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (b, w))
            and isinstance(d, bool)):
        return None
    return epoch_batches(length, b, w, d)


def distributed_defaults(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """rank/world_size as given, else torch.distributed's when it is initialised, else (0, 1)."""
    import torch.distributed as dist

    active = dist.is_available() and dist.is_initialized()
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


_DATASET_DROP = ("world_size", "order", "cache_budget")  # a dataset's are its batch sampler's


class ResumableDataset:
    """state_dict() / load_state_dict() / batch_sampler() of a map-style patchstore Dataset (mixin).

    The class provides `seed`, `epoch`, `set_epoch`, `__len__`, `store` and `options` (the options it
    was built with); states are tagged with its name. Its __getitem__ / __getitems__ call
    ``_check_resume()``.
    """

    # What the class provides (attributes set by its __init__; the rest it overrides).
    seed: int
    store: Store

    @property
    def epoch(self) -> int:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def options(self) -> Dict[str, Any]:
        raise NotImplementedError

    @property
    def _state_type(self) -> str:
        return type(self).__name__
    # (epoch, first batch, batch sampler options of the state) restored by load_state_dict, for the next
    # epoch `epoch` of batch_sampler() (which checks that its options are the state's).
    _resume_at: Optional[Tuple[int, int, Dict[str, Any]]] = None
    # The options of the last batch_sampler() made (or of a loaded state): what state_dict() records.
    _batch_options: Optional[Dict[str, Any]] = None
    # Shared with DataLoader workers (fork and spawn): -1 - epoch of a mid-epoch position restored by
    # load_state_dict that no batch sampler of this dataset has taken yet; 0 when none. (-1 - epoch fits the
    # int64 for every epoch; epoch + 1 wrapped at epoch 2**63 - 1, which turned the check off.)
    _resume_pending: Any = None

    def _locality_items(self) -> Tuple[np.ndarray, np.ndarray]:
        """(items in storage order, the record bytes each reads): what order='locality' cuts into blocks."""
        raise NotImplementedError(f"{type(self).__name__} has no locality order")

    def _state_checks(self) -> Tuple[Dict[str, Any], Dict[str, Any], str]:
        """(legacy top-level keys, recorded options, store identity) of this dataset."""
        legacy = {"seed": int(self.seed), "length": len(self)}
        return legacy, recorded_options(self.options, drop=_DATASET_DROP), store_identity(self, self.store)

    def state_dict(self, batch: int = 0) -> Dict[str, Any]:
        """The position to resume from: {type, version, options, store, length, batch_sampler, epoch,
        batch}.

        `batch`: how many batches of the current epoch (``self.epoch``) the
        training loop has consumed (its step within the epoch; 0 at an epoch
        start). The dataset cannot count them itself: a DataLoader fetches
        ahead of the loop. (torchdata's StatefulDataLoader calls state_dict()
        in its workers for the epoch, and keeps the batch count itself.)

        options: the dataset's options that change what it serves; store: the
        store's identity (see patchstore._resume); batch_sampler: the options
        of the last ``batch_sampler()`` made (batch_size, shuffle, drop_last,
        world_size, order, cache_budget: what the batch count refers to;
        absent when none was made). A batch count > 0 needs one: ValueError
        otherwise (another sampler, e.g. ``DataLoader(ds, shuffle=True)``,
        cannot resume mid-epoch).
        """
        from ._sampler_options import _position
        b = _position(batch, "batch", f"{self._state_type}.state_dict: ")
        if b and self._batch_options is None:
            raise ValueError(f"{self._state_type}.state_dict(batch={b}): no batch_sampler() of this dataset was "
                             f"made, so batch {b} names no position (DataLoader(ds, shuffle=True) draws an order "
                             f"that cannot be resumed). Build the loader as DataLoader(ds, batch_sampler="
                             f"ds.batch_sampler(B)), or save state_dict() at an epoch start")
        legacy, options, store = self._state_checks()
        state: Dict[str, Any] = {"type": self._state_type, "version": STATE_VERSION, "options": options,
                                 "store": store, "length": legacy["length"]}
        if self._batch_options is not None:
            state["batch_sampler"] = dict(self._batch_options)
        state.update(epoch=int(self.epoch), batch=b)
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores a state_dict(): sets the epoch, and makes the next epoch of ``batch_sampler()``
        (if it is that epoch) start after the consumed batches.

        ValueError if the state was saved with other options (naming the
        first that differs and both values), from another store, or at a batch
        past the end of the epoch of the batch sampler it records; the batch
        sampler's options are checked when it starts that epoch. A state saved
        before options were recorded (version 2) loads, checked against seed,
        length and order only. After loading a mid-epoch state (batch > 0),
        reading items of that epoch through anything but this dataset's
        ``batch_sampler()`` raises RuntimeError (``DataLoader(ds,
        shuffle=True)`` would serve a different, full epoch).
        """
        legacy, options, store = self._state_checks()
        epoch, batch = check_state(state, self._state_type, legacy, options, store, str(self.store.path))
        if state.get("version") == STATE_VERSION:
            bs = state.get("batch_sampler")
            sampler = dict(bs) if isinstance(bs, dict) else None
        else:  # version 2: only the order was recorded
            sampler = {"order": state.get("order", _STATE_DEFAULTS["order"]),
                       "cache_budget": state.get("cache_budget", _STATE_DEFAULTS["cache_budget"])}
        if batch and sampler is None:
            raise ValueError(f"{self._state_type}.load_state_dict: the state is at batch {batch} of epoch {epoch} "
                             f"but records no batch sampler, so the batches it counted cannot be found again")
        batches = None if sampler is None else _sampler_batches(sampler, len(self))
        if batches is not None and batch > batches:  # (a version-2 state: checked when the epoch resumes)
            raise past_the_end(f"{self._state_type}.load_state_dict", "its batch sampler", batch, batches, epoch)
        self.set_epoch(epoch)
        self._batch_options = sampler
        self._resume_at = (epoch, batch, sampler or {}) if batch else None
        if batch and self._resume_pending is None:
            from ._shared import _SharedEpoch

            self._resume_pending = _SharedEpoch(0)
        if self._resume_pending is not None:
            self._resume_pending.value = -1 - epoch if batch else 0

    def _check_resume(self) -> None:
        """RuntimeError when items of an epoch restored mid-epoch are read before this dataset's batch
        sampler took the position: the loader reading them is not the batch sampler, and would serve a
        different, full epoch."""
        p = self._resume_pending
        if p is None:
            return
        v = p.value
        if v and -1 - v == self.epoch:
            at = self._resume_at
            where = f"batch {at[1]} of epoch {-1 - v}" if at is not None else f"the middle of epoch {-1 - v}"
            raise RuntimeError(
                f"{self._state_type}: a state saved at {where} was loaded, but items are being read by a loader "
                f"that does not use this dataset's batch_sampler() (e.g. DataLoader(ds, shuffle=True), or a "
                f"sampler of its own): it would serve a different, full epoch. Resume with DataLoader(ds, "
                f"batch_sampler=ds.batch_sampler(B)) (the batch size and options of the saved run), or restart "
                f"the epoch: ds.load_state_dict(dict(state, batch=0))")

    def batch_sampler(self, batch_size: int, shuffle: bool = True, drop_last: bool = False,
                      rank: Optional[int] = None, world_size: Optional[int] = None, *, order: Any = UNSET,
                      cache_budget: Any = UNSET) -> "EpochBatchSampler":
        """A batch sampler for ``DataLoader(dataset, batch_sampler=...)`` that resumes mid-epoch.

        See `EpochBatchSampler` (order="locality" with cache_budget: blocks of storage order).
        The dataset's state_dict() records its options.
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
        self.dataset = dataset
        self.batch_size = operator.index(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_sampler: batch_size must be >= 1, got {batch_size!r}")
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.rank, self.world_size = distributed(rank, world_size)
        dataset._batch_options = self.options

    @property
    def options(self) -> Dict[str, Any]:
        """What the dataset's state records of this batch sampler (rank left out: one rank's state resumes
        every rank)."""
        return {"batch_size": self.batch_size, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "world_size": self.world_size, "order": self.order_name, "cache_budget": self.cache_budget or None}

    def _mine(self) -> int:
        return rank_items(len(self.dataset), self.world_size, self.drop_last)

    def __len__(self) -> int:
        return epoch_batches(len(self.dataset), self.batch_size, self.world_size, self.drop_last)

    def order(self, epoch: int) -> np.ndarray:
        """The indices this rank reads in `epoch`, in order (before cutting into batches)."""
        from ._sampler_options import _position
        epoch = _position(epoch, "epoch")
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
        mine = self.order(epoch)
        B = self.batch_size
        for b in range(_position(start, "start"), len(self)):
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
            if ds._resume_pending is not None:
                ds._resume_pending.value = 0  # taken by the batch sampler (workers see it: shared memory)
            if at[0] == epoch:
                mine = self.options
                rank_of = {k: i for i, k in enumerate(mine)}  # named in this order (order before cache_budget)
                for key, saved in sorted(at[2].items(), key=lambda kv: rank_of.get(kv[0], len(rank_of))):
                    if key == "cache_budget":  # None and 0 both mean none (version-2 states hold 0)
                        saved, mine[key] = saved or None, mine[key] or None
                    if mine.get(key, _MISSING) != saved:
                        raise ValueError(f"{type(ds).__name__}.batch_sampler: the loaded state was saved with "
                                         f"{key}={saved!r}, this batch sampler has {key}={mine.get(key)!r}: its "
                                         f"batches would not continue that epoch")
                start = at[1]
                if start > len(self):
                    raise past_the_end(f"{type(ds).__name__}.batch_sampler: the loaded state", "this batch sampler",
                                       start, len(self), epoch)
        yield from self.batches(epoch, start)

    def __repr__(self) -> str:
        return (f"EpochBatchSampler(batch_size={self.batch_size}, shuffle={self.shuffle}, order={self.order_name!r}, "
                f"drop_last={self.drop_last}, rank={self.rank}, world_size={self.world_size}, batches={len(self)})")
