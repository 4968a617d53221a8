"""Rank-local reading of a shard set: each rank reads only the shards assigned to it.

The default (``patchstore.open(shards)`` with a sampler's ``rank``/``world_size``)
shuffles globally: every rank may draw from every shard, so every node needs
the whole set. :class:`RankLocalShards` instead assigns whole shards to ranks,
again each epoch (a permutation of the shards by ``(seed, epoch)``, dealt
round-robin: rank r gets positions r, r + world_size, ...), so a node needs
only its ranks' shards on local disk (e.g. copied there with ``patchstore
copy``), at the price of a coarser shuffle (samples of one shard stay on one
rank for an epoch) and of unequal epoch lengths when shards differ in size
(a training loop must stop every rank at the same step, e.g. after
``min_len`` batches gathered with ``torch.distributed.all_reduce``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Union

import numpy as np

from . import _patchstore as _C
from ._store import Store, _resolve_stores

__all__ = ["RankLocalShards"]


class RankLocalShards:
    """The shards of a set that rank ``rank`` of ``world_size`` reads in each epoch.

    shards: a shard set as :func:`patchstore.open` takes it (list, folder, glob).
    Every shard is assigned to exactly one rank per epoch; ``world_size`` must
    not exceed the number of shards (a rank without a shard could not train).
    """

    def __init__(self, shards: Union[str, Sequence[str]], rank: int, world_size: int, seed: int = 0) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"RankLocalShards: need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        whole = Store(shards)  # checks the set: every shard once, ids unique
        self._paths: List[str] = list(whole.store_paths)
        self.rank, self.world_size, self.seed = int(rank), int(world_size), int(seed)
        if world_size > len(self._paths):
            raise ValueError(f"RankLocalShards: {len(self._paths)} shards cannot be spread over {world_size} ranks "
                             f"(each rank needs at least one shard); use more shards or global mode")
        self._options = whole.options

    @property
    def shard_count(self) -> int:
        return len(self._paths)

    def assignment(self, epoch: int) -> List[int]:
        """Indices (in shard order) of the shards this rank reads in `epoch`, sorted."""
        perm = np.arange(len(self._paths), dtype=np.int64)
        _C.shuffle(perm, self.seed & 0xFFFFFFFFFFFFFFFF, int(epoch), 0x524E4B4C)  # 'RNKL', reader/transform.h
        return sorted(int(i) for i in perm[self.rank::self.world_size])

    def paths(self, epoch: int) -> List[str]:
        return [self._paths[i] for i in self.assignment(epoch)]

    def open(self, epoch: int) -> Store:
        """This rank's shards for `epoch`, read as one store (build the sampler or dataset on it with
        rank=0, world_size=1: the ranks' stores are disjoint)."""
        return Store(self.paths(epoch), partial_set=True, **self._options)

    def state_dict(self) -> Dict[str, Any]:
        return {"shard_count": self.shard_count, "world_size": self.world_size, "rank": self.rank, "seed": self.seed}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Refuses a state saved with another shard count or world size (the assignment would differ)."""
        for key in ("shard_count", "world_size", "seed"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"RankLocalShards: the state was saved with {key}={state.get(key)!r}, this run has "
                                 f"{key}={getattr(self, key)!r}; the shards per rank would differ")
