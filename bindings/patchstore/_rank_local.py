"""Rank-local reading of a shard set: each rank reads only the shards assigned to it.

The default (``patchstore.open(shards)`` with a sampler's ``rank``/``world_size``)
shuffles globally: every rank may draw from every shard, so every node needs
the whole set. `RankLocalShards` instead deals whole shards to ranks: a
permutation of the N shards (N read from the shards' own ``shard`` = "I/N"
attribute), dealt round-robin (rank r gets positions r, r + world_size, ...).

``assign="fixed"`` (the default): the permutation depends on ``seed`` only, so
a rank reads the same shards every epoch and its node needs only those shards
on local disk (copied there with ``patchstore copy``) for the whole run.
``assign="per_epoch"``: a new permutation each epoch, by ``(seed, epoch)``: a
finer shuffle over the run, but every rank reads every shard sooner or later,
so every shard must be reachable from every node (a shared filesystem).
Both cost a coarser shuffle than global mode (samples of one shard stay on one
rank for an epoch).

Shards hold different numbers of samples, so ranks would get epochs of
different lengths (and a DDP job hangs at the end of the shortest one).
`RankLocalShards.sampler` gives every rank the same epoch length, as
torch's DistributedSampler does: ``even="pad"`` (its drop_last=False) serves
the longest rank's count, a shorter rank repeating its epoch's windows from
the start, so every sample is read at least once per epoch across ranks;
``even="truncate"`` (drop_last=True) serves the shortest rank's count, so
every sample at most once. The common length is agreed with
``torch.distributed.all_reduce`` when a process group is initialised, else
counted from every shard when all of them are reachable.
"""

from __future__ import annotations

import operator
import os
import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _patchstore as _C
from ._config import UNSET
from ._sampler import PatchSampler, Windows
from ._sampler_options import _position
from ._store import Store, _is_store, _resolve_stores

__all__ = ["RankLocalShards", "RankLocalSampler"]

_ASSIGN = ("fixed", "per_epoch")
_EVEN = (None, "pad", "truncate")
# Salts of the shard permutations (reader/transform.h): 'RNKL' per epoch, 'RNKF' fixed.
_SALT_PER_EPOCH, _SALT_FIXED = 0x524E4B4C, 0x524E4B46


def _parse_shard(text: str, path: str) -> Tuple[int, int]:
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"RankLocalShards: '{path}' records shard {text!r}, not I/N") from None
    if not 0 <= i < n:
        raise ValueError(f"RankLocalShards: '{path}' records shard {text!r}, not I/N with 0 <= I < N")
    return i, n


class RankLocalShards:
    """The shards of a shard set that rank ``rank`` of ``world_size`` reads, epoch by epoch.

    shards: the shards this node has, as `patchstore.open` takes a set
    (list of paths, folder, glob; paths of a list that do not exist are
    skipped). Only the shards assigned to this rank need to be there: the
    shard count N comes from the shards' own ``shard`` attribute ("I/N").
    All given stores must be shards of one set (same N, each index once).
    ``world_size`` must not exceed N (a rank without a shard could not
    train).

    assign: "fixed" (default; the same shards every epoch, dealt by a
    permutation of ``seed``: a node needs only its own shards) or
    "per_epoch" (dealt again each epoch by (seed, epoch): every shard must be
    reachable from every node, e.g. on a shared filesystem). A missing
    assigned shard is a ``FileNotFoundError`` naming the shard, rank, epoch
    and where it was looked for.

    verify_checksums, no_lock: as `patchstore.open`, for the stores opened.
    """

    def __init__(self, shards: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]],
                 rank: int, world_size: int, seed: int = 0, *, assign: str = "fixed",
                 verify_checksums: bool = False, no_lock: bool = False) -> None:
        rank, world_size, seed = operator.index(rank), operator.index(world_size), operator.index(seed)
        if not 0 <= rank < world_size:
            raise ValueError(f"RankLocalShards: need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if assign not in _ASSIGN:
            raise ValueError(f"RankLocalShards: assign must be 'fixed' or 'per_epoch', got {assign!r}")
        if not 0 <= seed < 2 ** 64:
            raise ValueError(f"RankLocalShards: seed must be in [0, 2**64), got {seed}")
        self.rank, self.world_size, self.seed, self.assign = rank, world_size, seed, assign
        self._options = {"verify_checksums": bool(verify_checksums), "no_lock": bool(no_lock)}
        self._where, paths = self._given(shards)
        self._found: Dict[int, str] = {}
        count = 0
        first = ""
        for p in paths:
            s = Store(p, **self._options)
            text = s.attributes.get("shard", "")
            s.close()
            if not text:
                raise ValueError(f"RankLocalShards: '{p}' is not a shard (ingested without --shard): rank-local "
                                 f"reading needs the shards of one set")
            i, n = _parse_shard(text, p)
            if count and n != count:
                raise ValueError(f"RankLocalShards: '{first}' is a shard of {count} but '{p}' is shard {i}/{n} "
                                 f"(stores of two different shard sets)")
            if i in self._found:
                raise ValueError(f"RankLocalShards: '{self._found[i]}' and '{p}' are both shard {i}/{n}")
            count, first = n, first or p
            self._found[i] = p
        self._count = count
        if world_size > count:
            raise ValueError(f"RankLocalShards: {count} shards cannot be spread over {world_size} ranks "
                             f"(each rank needs at least one shard); use more shards or global mode")

    @staticmethod
    def _given(shards: Any) -> Tuple[str, List[str]]:
        """(where the shards were looked for, for messages; the store paths given). Paths of a list that
        do not exist are left out: a node may be given every shard's path and hold only some."""
        shown, paths = _resolve_stores(shards)
        if isinstance(shown, tuple):
            here = [p for p in shown if _is_store(p)]
            if not here:
                raise FileNotFoundError(f"RankLocalShards: none of the {len(shown)} stores given exists "
                                        f"(first: '{shown[0]}')")
            absent = f" ({len(shown) - len(here)} of them absent)" if len(here) < len(shown) else ""
            return f"among the {len(shown)} paths given{absent}", here
        if paths is None:
            if not _is_store(shown):
                raise FileNotFoundError(f"RankLocalShards: no store at or under '{shown}'")
            return f"at '{shown}'", [shown]
        if os.path.isdir(shown):
            return f"under '{shown}'", list(paths)
        return f"matching '{os.fspath(shards)}'", list(paths)

    # -- assignment -----------------------------------------------------------------

    @property
    def shard_count(self) -> int:
        """N, the number of shards in the set (from the shards' ``shard`` attribute)."""
        return self._count

    @property
    def local_shards(self) -> Dict[int, str]:
        """{shard index: path} of the shards given (found on this node)."""
        return dict(sorted(self._found.items()))

    def assignment(self, epoch: int = 0, rank: Optional[int] = None) -> List[int]:
        """Indices of the shards rank `rank` (default: this rank) reads in `epoch`, sorted."""
        r = self.rank if rank is None else operator.index(rank)
        perm = np.arange(self._count, dtype=np.int64)
        if self.assign == "fixed":
            _C.shuffle(perm, self.seed, 0, _SALT_FIXED)
        else:
            _C.shuffle(perm, self.seed, _position(epoch, "epoch"), _SALT_PER_EPOCH)  # reader/transform.h
        return sorted(int(i) for i in perm[r::self.world_size])

    def paths(self, epoch: int = 0, rank: Optional[int] = None) -> List[str]:
        """The paths of those shards; FileNotFoundError names a shard that was not given."""
        r = self.rank if rank is None else operator.index(rank)
        want = self.assignment(epoch, r)
        missing = [i for i in want if i not in self._found]
        if missing:
            have = ", ".join(str(i) for i in sorted(self._found)) or "none"
            when = f"in epoch {epoch}" + (" and every other" if self.assign == "fixed" else "")
            raise FileNotFoundError(
                f"RankLocalShards: rank {r} of {self.world_size} reads shard{'s' if len(missing) > 1 else ''} "
                f"{', '.join(f'{i}/{self._count}' for i in missing)} {when} (assign={self.assign!r}, "
                f"seed {self.seed}), "
                f"but no store {self._where} is {'one of them' if len(missing) > 1 else 'that shard'} (shards found: "
                f"{have}); copy {'them' if len(missing) > 1 else 'it'} there "
                f"(patchstore copy) or read in global mode")
        return [self._found[i] for i in want]

    def open(self, epoch: int = 0) -> Store:
        """This rank's shards for `epoch`, read as one store (build a sampler on it with rank=0,
        world_size=1: the ranks' stores are disjoint). `sampler` also evens the epoch lengths."""
        return Store(self.paths(epoch), partial_set=True, **self._options)

    def sampler(self, fields: Union[str, Sequence[str]], patch_size: Any = UNSET, patches_per_sample: Any = UNSET,
                *, epoch: int = 0, even: Optional[str] = "pad", **options: Any) -> "RankLocalSampler":
        """A `RankLocalSampler` over this rank's shards, at the start of `epoch`.

        options: as `patchstore.PatchSampler` (seed defaults to this
        object's seed; rank and world_size are not taken: the shards split
        the ranks). even: "pad" (default), "truncate" or None (each rank its
        own length); see `RankLocalSampler`. With "pad"/"truncate"
        and world_size > 1, building it (and ``set_epoch`` with
        assign="per_epoch") is a collective when torch.distributed is
        initialised: call it on every rank.
        """
        return RankLocalSampler(self, fields, patch_size, patches_per_sample, epoch=epoch, even=even, **options)

    # -- state ------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        return {"shard_count": self.shard_count, "world_size": self.world_size, "rank": self.rank,
                "seed": self.seed, "assign": self.assign}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Refuses a state saved with another shard count, world size, seed or assign mode (the shards
        per rank would differ). A state without "assign" was saved before it existed: per_epoch."""
        for key in ("shard_count", "world_size", "seed", "assign"):
            saved = state.get(key, "per_epoch") if key == "assign" else state.get(key)
            if saved != getattr(self, key):
                raise ValueError(f"RankLocalShards: the state was saved with {key}={saved!r}, this run has "
                                 f"{key}={getattr(self, key)!r}; the shards per rank would differ")

    def __repr__(self) -> str:
        return (f"RankLocalShards({self._count} shards, {len(self._found)} here, rank={self.rank}, "
                f"world_size={self.world_size}, seed={self.seed}, assign={self.assign!r})")


def _process_group(world_size: int) -> Any:
    """torch.distributed when a process group is initialised (it is never imported here), else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() != world_size:
        raise ValueError(f"RankLocalShards: world_size={world_size}, but the torch.distributed process group "
                         f"has {dist.get_world_size()} ranks")
    return dist


class RankLocalSampler:
    """Batches of random windows from one rank's shards, with the same epoch length on every rank.

    Built by `RankLocalShards.sampler`; a `patchstore.PatchSampler`
    (``.sampler``) over this rank's shards (rank=0, world_size=1) does the
    drawing, so windows depend on (seed, epoch, this rank's shards) only.

    even="pad": ``len()`` is the largest window count of any rank; past its
    own count a rank serves its epoch's windows again from the start (window
    w of the epoch is the PatchSampler's window w % own), so every sample is
    read at least once per epoch across ranks. even="truncate": the smallest
    count; a rank serves the first ``len()`` windows of its epoch, every
    sample at most once. even=None: each rank its own count.

    The common length comes from ``torch.distributed.all_reduce`` (MAX or
    MIN) when a process group is initialised, else from samplers built over
    every rank's shards (all must be reachable). With assign="fixed" it is
    computed once; with "per_epoch" again at every ``set_epoch``.

    An epoch ends after ``len()`` windows: `batch` asks for no more
    than `remaining`; call `set_epoch` for the next one.
    """

    def __init__(self, shards: RankLocalShards, fields: Union[str, Sequence[str]], patch_size: Any = UNSET,
                 patches_per_sample: Any = UNSET, *, epoch: int = 0, even: Optional[str] = "pad",
                 **options: Any) -> None:
        if even not in _EVEN:
            raise ValueError(f"RankLocalSampler: even must be 'pad', 'truncate' or None, got {even!r}")
        for key in ("rank", "world_size"):
            if key in options:
                raise ValueError(f"RankLocalSampler: {key} is not an option here (each rank reads its own shards "
                                 f"with rank=0, world_size=1; RankLocalShards holds the rank)")
        if options.get("config") is None:
            options.setdefault("seed", shards.seed)
        options.update({k: v for k, v in (("patch_size", patch_size), ("patches_per_sample", patches_per_sample))
                        if v is not UNSET})
        self.shards, self.even = shards, even
        self._args = (fields,)
        self._kwargs = dict(options)
        self.sampler: PatchSampler = self._build(_position(epoch, "epoch", "RankLocalSampler: "))
        self._length = self._common_length(self.epoch)
        self._cursor = 0

    def _build(self, epoch: int, rank: Optional[int] = None) -> PatchSampler:
        store = Store(self.shards.paths(epoch, rank), partial_set=True, **self.shards._options)
        s = PatchSampler(store, *self._args, **self._kwargs, _who="patchstore.RankLocalSampler")
        s.set_epoch(epoch)
        return s

    def _common_length(self, epoch: int) -> int:
        own = len(self.sampler)
        if self.even is None or self.shards.world_size == 1:
            return own
        dist = _process_group(self.shards.world_size)
        if dist is not None:
            import torch  # loaded already: torch.distributed is

            device = torch.device("cpu")
            if dist.get_backend() == "nccl":
                device = torch.device("cuda", torch.cuda.current_device())
            t = torch.tensor([own], dtype=torch.int64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX if self.even == "pad" else dist.ReduceOp.MIN)
            return int(t.item())
        try:
            with warnings.catch_warnings():  # other ranks' skipped samples are theirs to report
                warnings.simplefilter("ignore", RuntimeWarning)
                counts = [own if r == self.shards.rank else len(self._build(epoch, r))
                          for r in range(self.shards.world_size)]
        except FileNotFoundError as e:
            raise RuntimeError(f"RankLocalSampler(even={self.even!r}): the common epoch length needs every "
                               f"rank's window count: initialise torch.distributed (the ranks agree on it with "
                               f"all_reduce), make every shard reachable, or pass even=None and stop every rank "
                               f"at the same step yourself ({e})") from None
        return max(counts) if self.even == "pad" else min(counts)

    # -- epochs ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Windows per epoch on this rank (equal on every rank with even="pad"/"truncate")."""
        return self._length

    @property
    def own_windows(self) -> int:
        """The windows this rank's shards give an epoch (before padding or truncation)."""
        return len(self.sampler)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def cursor(self) -> int:
        """The window of the epoch the next batch starts at."""
        return self._cursor

    @property
    def remaining(self) -> int:
        return self._length - self._cursor

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` (with assign="per_epoch": its shards, and a collective with even= set)."""
        e = _position(epoch, "epoch", "RankLocalSampler: ")
        if self.shards.assign == "per_epoch" and e != self.epoch:
            self.sampler = self._build(e)
            self._length = self._common_length(e)
        else:
            self.sampler.set_epoch(e)
        self._cursor = 0

    def _native_ranges(self, first: int, n: int) -> List[Tuple[int, int, int]]:
        """(offset in the batch, first native window, count) covering windows [first, first + n)."""
        own, out, done = len(self.sampler), [], 0
        if n and own == 0:
            self.sampler._no_windows(self.sampler._s(), "batch")
        while done < n:
            w = (first + done) % own
            take = min(n - done, own - w)
            out.append((done, w, take))
            done += take
        return out

    def gather(self, first: int, n: int, out: Optional[Mapping[str, Any]] = None, *,
               return_windows: bool = False) -> Any:
        """Windows [first, first + n) of the current epoch (stateless); out as PatchSampler.batch."""
        first, n = operator.index(first), operator.index(n)
        if first < 0 or n < 0 or first + n > self._length:
            raise IndexError(f"RankLocalSampler.gather: windows [{first}, {first + n}) outside the epoch's "
                             f"{self._length} windows")
        ps, epoch = self.sampler, self.epoch
        s = ps._s()
        shapes = ps.shapes(n)
        if out is None:
            result: Dict[str, Any] = {f: np.empty(shape, np.float32) for f, shape in shapes.items()}
        else:
            result = {f: out[f] for f in ps.fields}
        targets = []
        for f, t in zip(ps.fields, ps._targets(out if out is not None else result, n, "gather")):
            a = np.asarray(t)
            if a.shape != shapes[f] or a.dtype != np.float32 or not a.flags.c_contiguous or not a.flags.writeable:
                raise ValueError(f"RankLocalSampler.gather: out['{f}'] must be a writable C-contiguous float32 "
                                 f"array or tensor of shape {shapes[f]}, got {a.dtype} {a.shape}")
            targets.append(a)
        wins = np.empty((n, 6), dtype=np.int64)
        for at, w, take in self._native_ranges(first, n):
            s.gather(epoch, w, take, [t[at:at + take] for t in targets], wins[at:at + take])
        return (result, Windows(wins, ps.store)) if return_windows else result

    def batch(self, n: int, out: Optional[Mapping[str, Any]] = None, *, return_windows: bool = False) -> Any:
        """The next `n` windows of the epoch: {field: float32 (n, C, h, w)} (out as PatchSampler.batch)."""
        n = operator.index(n)
        if n < 0 or n > self.remaining:
            raise ValueError(f"RankLocalSampler.batch({n}): epoch {self.epoch} has {self.remaining} of its "
                             f"{self._length} windows left on rank {self.shards.rank}; ask for at most that many "
                             f"or call set_epoch({self.epoch + 1})")
        ps = self.sampler
        if out is None:
            out = ps._recycler.take(n, {f: shape[1:] for f, shape in ps.shapes(n).items()})
        result, wins = self.gather(self._cursor, n, out, return_windows=True)
        self._cursor += n
        nxt = min(n, self.remaining)
        if nxt and ps._opts.prefetch_next:  # the next batch's bytes, read while this one is used
            for _, w, take in self._native_ranges(self._cursor, nxt):
                ps._s().prefetch_ahead(self.epoch, w, take)
        return (result, wins) if return_windows else result

    def windows(self) -> Windows:
        """All windows of the current epoch on this rank, in order (no pixels copied)."""
        own = self.sampler.windows(self.epoch)
        idx = np.arange(self._length, dtype=np.int64) % max(len(own), 1)
        return Windows(np.ascontiguousarray(own.array[idx]), self.sampler.store)

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The shards' state with even, the epoch, the next window and the epoch length."""
        return {**self.shards.state_dict(), "even": self.even, "epoch": self.epoch, "cursor": self._cursor,
                "length": self._length}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues where the state was saved (refused for other shards, ranks, seed, assign or even)."""
        self.shards.load_state_dict(state)
        if state.get("even") != self.even:
            raise ValueError(f"RankLocalSampler: the state was saved with even={state.get('even')!r}, this run "
                             f"has even={self.even!r}; the epoch lengths would differ")
        self.set_epoch(_position(state["epoch"], "epoch", "RankLocalSampler.load_state_dict: "))
        if int(state["length"]) != self._length:
            raise ValueError(f"RankLocalSampler: the state was saved with epochs of {state['length']} windows, "
                             f"this run has {self._length} (other sampler options or shards)")
        self._cursor = int(state["cursor"])

    def __repr__(self) -> str:
        return (f"RankLocalSampler(rank={self.shards.rank}, world_size={self.shards.world_size}, even={self.even!r}, "
                f"epoch={self.epoch}, windows={self._length}, own={self.own_windows})")
