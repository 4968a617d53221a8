"""patchstore.torch.BatchLoader: ready batches of random patches gathered in C++."""

from __future__ import annotations

import operator
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import IterableDataset

from .._config import UNSET, SamplerConfig, positional_options
from .._resume import STATE_VERSION, past_the_end, recorded_options, store_identity
from .._sampler import PatchSampler
from .._sampler_options import POSITION_LIMIT, _position
from .._store import Store
from ._common import _distributed_defaults, _empty, _EpochCounter, _Ring
from ._stored import DeviceFeed, FloatConverter, check_device, check_output, stored_dtypes

# BatchLoader's arguments by position before SamplerConfig (after path, fields, patch_size, batch_size), and
# those of them that are the loader's own, not sampling options.
_POSITIONAL = ("patches_per_sample", "require", "min_valid", "positive_fraction", "seed", "rank",
               "world_size", "num_threads", "pin_memory", "flip", "rot90", "drop_last", "buffers")
_OWN = ("pin_memory", "drop_last", "buffers")


def _dist_active() -> bool:
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


class BatchLoader(IterableDataset[Dict[str, torch.Tensor]]):
    """Ready batches of random patches: {field: float32 tensor (B, C, P, P)}, one epoch per iter().

    Built on `patchstore.PatchSampler` (same options, same windows):
    each batch is one C++ gather of B windows for every field, on
    ``num_threads`` threads with the GIL released, straight into a reused
    buffer. No per-sample Python work, no collate, no per-batch allocation.

    path: a store path or a `patchstore.Store`. batch_size: windows
    per batch (B; with patches_per_sample=k, a batch covers B/k sample
    visits). Sampling options: ``config=`` `patchstore.SamplerConfig`
    and/or its fields as keywords, defaults from it (the older positional
    order still works). patch_size: P or (h, w); require, min_valid,
    positive_fraction, policy, flip, rot90, ids (a subset of sample ids or
    indices): as PatchSampler and PatchDataset, with the same meaning.
    ``len(loader)``: batches per epoch on this rank, the last one smaller
    unless ``drop_last``.

    Epochs: ``set_epoch(e)`` (as with DistributedSampler) makes the next
    iter() yield epoch e; without it each iter() yields the epoch after the
    previous one (0, 1, 2, ...), counted per process. ``epoch``: the epoch
    the next iter() in this process yields.

    rank / world_size: shard of each epoch (as DistributedSampler); not
    given (or None) and without a config, they come from torch.distributed
    when it is initialised, else from SamplerConfig.

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

    prefetch, order, cache_budget: as PatchSampler. With prefetch (the
    default), after gathering a batch the loader keeps the byte ranges of
    the next `prefetch` batches it will gather (this worker's next ones)
    requested, so the disk reads them while this one is used.

    Stored bytes to the device: ``output="stored"`` yields each field in
    its stored dtype (uint8/uint16/int16 source values of a compact store,
    float16, float32: ``store.fields[f].dtype``), 2.5-3.3x fewer bytes than
    float32; `patchstore.torch.to_float` turns them into the float32
    batch bit for bit. ``device="cuda"`` (or ``"cuda:N"``) gathers the
    stored bytes into the pinned ring, copies them to the device on a side
    stream and converts them there (output="float32", the default) or not
    (output="stored"): batches arrive as tensors on that device, equal bit
    for bit to the CPU float32 batches, with the same windows, determinism
    and state_dict. The ring slot of a batch is refilled only after its copy
    has finished (a CUDA event). ``device="cpu"`` is the default loader
    (float32 gathered directly). Device conversion runs in the training process (CUDA cannot be used in
    DataLoader workers): there, use output="stored" and to_float after the
    DataLoader.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Store],
        fields: Union[str, Sequence[str]],
        patch_size: Any = UNSET,
        batch_size: Any = UNSET,
        *positional: Any,
        config: Optional[SamplerConfig] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        buffers: int = 2,
        output: str = "float32",
        device: Any = None,
        **options: Any,
    ) -> None:
        super().__init__()
        who = "patchstore.torch.BatchLoader"
        options = positional_options(who, patch_size, positional, _POSITIONAL, options)
        # The loader's own arguments that the older positional order put among the sampling options.
        own: Dict[str, Any] = dict(pin_memory=pin_memory, drop_last=drop_last, buffers=buffers)
        own.update({k: options.pop(k) for k in _OWN if k in options})
        pin_memory, drop_last, buffers = own["pin_memory"], own["drop_last"], own["buffers"]
        if batch_size is UNSET:
            raise TypeError(f"{who}: missing required argument 'batch_size'")
        # rank / world_size None or not given: torch.distributed's when it is initialised (without a config)
        dist = None if config is not None else _distributed_defaults(None, None)
        for i, k in enumerate(("rank", "world_size")):
            if options.get(k, None) is None:
                options.pop(k, None)
                if dist is not None and _dist_active():
                    options[k] = dist[i]
        self.sampler = PatchSampler(path, fields, config=config, _who=who, **options)
        self.batch_size = operator.index(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"BatchLoader: batch_size must be >= 1, got {batch_size!r}")
        self.buffers = operator.index(buffers)
        if self.buffers < 1:
            raise ValueError(f"BatchLoader: buffers must be >= 1, got {buffers!r}")
        self.output = check_output(output, who)
        self.device = check_device(device, who)
        # CUDA copies from pinned memory overlap the gather of the next batch.
        self.pin_memory = bool(pin_memory) or (self.device is not None and self.device.type == "cuda")
        self.drop_last = bool(drop_last)
        # The dtypes the gather writes: stored for output="stored" and for a conversion on a CUDA device
        # (device="cpu" gathers float32 directly: the same values, with no conversion pass).
        self._cuda = self.device is not None and self.device.type == "cuda"
        self._gather_dtypes = (stored_dtypes(self.store, self.fields)
                               if self.output == "stored" or self._cuda else {})
        self._feed: Optional[DeviceFeed] = None
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
        state["_feed"] = None  # CUDA streams and tables belong to the process that made them
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
        """The epoch the next iter() in this process yields (2**63 once the last epoch, 2**63 - 1, was iterated:
        there is no next one, and iter() raises)."""
        return self._epochs.peek(self._slot())

    def set_epoch(self, epoch: int) -> None:
        """The next iter() (here and in DataLoader workers, persistent or not) yields epoch `epoch`."""
        e = _position(epoch, "epoch", "BatchLoader: ")
        self._epochs.set(e)
        if self._resume is not None and self._resume[0] != e:
            self._resume = None  # a position restored by load_state_dict holds for its own epoch only

    # -- iteration -------------------------------------------------------------------

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        slot = self._slot()
        if self._epochs.peek(slot) >= POSITION_LIMIT:
            raise RuntimeError(f"BatchLoader: epoch {POSITION_LIMIT - 1} (2**63 - 1), the last epoch the sampler "
                               f"represents, has been served; there is no next epoch to iterate. Call set_epoch() "
                               f"to choose the epoch to serve")
        epoch = self._epochs.take(slot)
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
        e = _position(epoch, "epoch", "BatchLoader: ")
        return self._batches(e, range(len(self)), shared=torch.utils.data.get_worker_info() is not None)

    def _batches(self, epoch: int, which: range, shared: bool,
                 track: bool = False) -> Iterator[Dict[str, torch.Tensor]]:
        s = self.sampler._s()
        total = len(self.sampler)
        B = self.batch_size
        shapes = self.sampler.shapes(B)
        fields = self.fields
        pos = self._position if track else None
        prefetch = bool(self.sampler._opts.prefetch_next)
        last = which[-1] if len(which) else -1

        def ahead(b: int) -> None:  # batch prefetch: the next batches this iterator gathers
            if prefetch and b != last:
                nxt = (b + which.step) * B
                s.prefetch_ahead(epoch, nxt, min(B, total - nxt), which.step * B)

        for b in which:
            if pos is not None:
                pos[1] = b + which.step  # counted when handed out: the caller has it
            first = b * B
            n = min(B, total - first)
            if shared:
                if self._cuda:
                    raise RuntimeError(f"BatchLoader(device={str(self.device)!r}) converts in the training "
                                       "process; inside DataLoader workers use output='stored' and "
                                       "patchstore.torch.to_float(batch, loader, device=...) after the DataLoader")
                out = {f: _empty((n,) + shape[1:], True, self._gather_dtypes.get(f, torch.float32))
                       for f, shape in shapes.items()}
                s.gather(epoch, first, n, [out[f].numpy() for f in fields])
                ahead(b)
                yield out
                continue
            slot = self._ring_for(shapes).acquire()
            s.gather(epoch, first, n, [slot.arrays[f][:n] for f in fields])
            ahead(b)
            if self._cuda:
                yield self._feed_for()(slot, n, fields)
                continue
            yield {f: slot.tensors[f][:n] for f in fields}  # new views: they keep the slot busy

    # -- resuming ----------------------------------------------------------------------

    # This process's iteration: [epoch, next batch, stride] (None before the first iter()).
    _position: Optional[List[int]]
    # (epoch, first batch, worker-local) for the next iter() of that epoch, set by load_state_dict.
    _resume: Optional[Tuple[int, int, bool]]

    def _init_resume(self) -> None:
        self._position = None
        self._resume = None

    def _state_options(self) -> Dict[str, Any]:
        o = self.sampler.options
        return {"seed": int(o["seed"]), "world_size": int(o["world_size"]), "batch_size": self.batch_size,
                "batches": len(self), "order": o["order"], "cache_budget": int(o["cache_budget"] or 0)}

    def _recorded_options(self) -> Dict[str, Any]:
        return recorded_options({**self.sampler.options, "batch_size": self.batch_size, "drop_last": self.drop_last})

    def state_dict(self, epoch: Optional[int] = None, batch: Optional[int] = None) -> Dict[str, Any]:
        """Where this process stands: {type, version, options, store, batches, epoch, batch}.

        options: every option that changes the batches (fields, patch_size,
        patches_per_sample, require, min_valid, positive_fraction, policy,
        flip, rot90, ids, seed, world_size, batch_size, drop_last, order,
        cache_budget); store: the store's identity (see patchstore._resume);
        batches: batches per epoch on this rank.

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
            e = self.epoch if epoch is None else _position(epoch, "epoch", "BatchLoader.state_dict: ")
            b = 0 if batch is None else _position(batch, "batch", "BatchLoader.state_dict: ")
            worker: Optional[Tuple[int, int]] = None
        elif pos is None:
            e, b = self.epoch, 0 if info is None else info.id
            worker = None if info is None else (info.id, info.num_workers)
        else:
            e, b = pos[0], pos[1]
            worker = None if info is None else (info.id, info.num_workers)
        if e >= POSITION_LIMIT:  # the counter ran past the last epoch: the end of that epoch
            e, b = POSITION_LIMIT - 1, nb if worker is None else nb + b
        if b >= nb and worker is None and e + 1 < POSITION_LIMIT:  # that epoch is done: the start of the next one
            e, b = e + 1, 0
        # (The last epoch, 2**63 - 1, has no next one: its end is batch nb.)
        # (A worker's state keeps its epoch: the DataLoader may not have ended that epoch yet.)
        state: Dict[str, Any] = {"type": "BatchLoader", "version": STATE_VERSION, "options": self._recorded_options(),
                                 "store": store_identity(self, self.store), "batches": nb, "epoch": e, "batch": b}
        if worker is not None:
            state["worker"], state["num_workers"] = worker
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues a run from a state_dict(): the next iter() yields the rest of the saved epoch (the
        batches after the ones consumed), and later iter() calls the epochs after it, exactly as the
        uninterrupted run would have, here and in DataLoader workers started afterwards (fork or spawn).

        ValueError if the state was saved with other options (naming the first that differs and both
        values: "the state was saved with patch_size=256, this BatchLoader has patch_size=128"), from
        another store, with another number of batches per epoch, or at a batch past the end of its epoch
        (batch == batches, the end of the epoch, loads). A state saved before options were
        recorded (version 2) loads, checked against seed, world_size, batch_size, batches, order and
        cache_budget only (without order: order='random'). Calling ``set_epoch`` with the saved epoch
        afterwards keeps the position; another epoch drops it.
        """
        from .._resume import check_state

        epoch, batch = check_state(state, "BatchLoader", self._state_options(), self._recorded_options(),
                                   store_identity(self, self.store), str(self.store.path))
        info = torch.utils.data.get_worker_info()
        if "worker" in state:
            w, n = state.get("worker"), state.get("num_workers")
            if info is None or (info.id, info.num_workers) != (w, n):
                where = "the training process" if info is None else f"worker {info.id} of {info.num_workers}"
                raise ValueError(f"BatchLoader.load_state_dict: this state was saved in DataLoader worker {w} of "
                                 f"{n} (by torchdata's StatefulDataLoader); it cannot be loaded in {where}")
            # Worker w of n reads batches w, w + n, ...: its next one after the epoch is at most len + n - 1.
            if batch > len(self) + info.num_workers - 1:
                raise past_the_end("BatchLoader.load_state_dict", f"this BatchLoader (worker {w} of {n})", batch,
                                   len(self), epoch)
            slot = self._slot()
            a = self._epochs._shared
            a[slot] = epoch - int(a[0])  # this worker's next iter() yields `epoch`, later ones the following
            self._resume = (epoch, batch, True)
            return
        if batch > len(self):
            raise past_the_end("BatchLoader.load_state_dict", "this BatchLoader", batch, len(self), epoch)
        self._epochs.set(epoch)
        self._resume = (epoch, batch, False) if batch else None

    def _ring_for(self, shapes: Mapping[str, Tuple[int, ...]]) -> _Ring:
        if self._ring is None or self._ring_pid != os.getpid():
            self._ring = _Ring(shapes, self.buffers, self.pin_memory, "patchstore.torch.BatchLoader",
                               self._gather_dtypes)
            self._ring_pid = os.getpid()
        return self._ring

    def _feed_for(self) -> DeviceFeed:
        """The device feed of this process (made on first use: CUDA streams and tables are per process)."""
        assert self.device is not None and self._cuda
        if self._feed is None:
            self._feed = DeviceFeed(FloatConverter(self.store, self.fields, self.device), self.device,
                                    convert=self.output == "float32")
        return self._feed
