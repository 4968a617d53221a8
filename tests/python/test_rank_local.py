"""Rank-local reading (issue 16 item 3): RankLocalShards on a node holding only its shards, fixed and
per-epoch assignment, and equal epoch lengths over shards of unequal sizes (RankLocalSampler)."""

from __future__ import annotations

import pickle
import shutil
from collections import Counter
from pathlib import Path
from typing import List

import numpy as np
import pytest

import patchstore

from conftest import TEMPLATES, make_frames

N = 4
SIZES = [6, 9, 2, 7]  # samples per shard of this input (xxh3 of the ids mod 4): unequal on purpose


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    """24 frames ingested as 4 shards (Python ingest, no CLI needed) and as one store."""
    base = tmp_path_factory.mktemp("ranklocal")
    root = base / "data"
    make_frames(root, ["v1", "v2", "v3"], range(1, 9), seed=3)
    set_dir = base / "set"
    for i in range(N):
        patchstore.ingest_images(str(set_dir / f"f-{i}.ps"), root=root, fields=TEMPLATES, shard=(i, N),
                                 durable=False, progress=False)
    assert [len(patchstore.open(set_dir / f"f-{i}.ps")) for i in range(N)] == SIZES
    return base, root, set_dir


def _node(set_dir: Path, dest: Path, indices: List[int]) -> Path:
    """A node's local disk: copies of the shards `indices` only."""
    dest.mkdir()
    for i in indices:
        shutil.copytree(set_dir / f"f-{i}.ps", dest / f"f-{i}.ps")
    return dest


def _ids_of(set_dir: Path, indices: List[int]) -> List[str]:
    return sorted(sid for i in indices for sid in patchstore.open(set_dir / f"f-{i}.ps").ids)


def test_fixed_and_per_epoch_assignment(shard_set):
    base, root, set_dir = shard_set
    fixed = [patchstore.RankLocalShards(set_dir, r, 2, seed=1) for r in range(2)]
    per_epoch = [patchstore.RankLocalShards(set_dir, r, 2, seed=1, assign="per_epoch") for r in range(2)]
    assert fixed[0].assign == "fixed" and fixed[0].shard_count == N
    # Pinned: changing the deal would move every node's shards.
    assert [rl.assignment(0) for rl in fixed] == [[0, 2], [1, 3]]
    seen_per_epoch = set()
    for epoch in range(6):
        assert [rl.assignment(epoch) for rl in fixed] == [[0, 2], [1, 3]]  # the same every epoch
        parts = [rl.assignment(epoch) for rl in per_epoch]
        assert sorted(parts[0] + parts[1]) == list(range(N))  # each shard to exactly one rank
        assert parts == [rl.assignment(epoch) for rl in (patchstore.RankLocalShards(
            set_dir, r, 2, seed=1, assign="per_epoch") for r in range(2))]  # deterministic
        seen_per_epoch.add(tuple(map(tuple, parts)))
    assert len(seen_per_epoch) > 1  # per_epoch deals again
    # Another seed deals differently (for some seed), and 4 ranks get one shard each.
    assert any(patchstore.RankLocalShards(set_dir, 0, 2, seed=s).assignment() != [0, 2] for s in range(2, 8))
    assert sorted(patchstore.RankLocalShards(set_dir, r, 4).assignment()[0] for r in range(4)) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="assign must be 'fixed' or 'per_epoch', got 'each'"):
        patchstore.RankLocalShards(set_dir, 0, 2, assign="each")
    with pytest.raises(ValueError, match="4 shards cannot be spread over 5 ranks"):
        patchstore.RankLocalShards(set_dir, 0, 5)


def test_a_node_with_only_its_shards(shard_set, tmp_path):
    """Rank r's reader built from a folder holding just its 2 of the 4 shards."""
    base, root, set_dir = shard_set
    for r, mine in enumerate(([0, 2], [1, 3])):
        node = _node(set_dir, tmp_path / f"node{r}", mine)
        rl = patchstore.RankLocalShards(node, r, 2, seed=1)
        assert rl.shard_count == N and rl.assignment() == mine
        assert rl.local_shards == {i: str(node / f"f-{i}.ps") for i in mine}
        for epoch in (0, 3):
            store = rl.open(epoch)
            assert sorted(store.ids) == _ids_of(set_dir, mine)
            assert store.store_paths == tuple(str(node / f"f-{i}.ps") for i in mine)
        s = rl.sampler(["rgb", "mask"], 8, even=None)  # no common length asked: nothing else needed
        assert len(s) == sum(SIZES[i] for i in mine)
        assert sorted(s.windows().ids) == _ids_of(set_dir, mine)
    # The same through a glob, and through every shard's path with only some present.
    node0 = tmp_path / "node0"
    assert patchstore.RankLocalShards(str(node0 / "f-*.ps"), 0, 2, seed=1).paths() == [
        str(node0 / "f-0.ps"), str(node0 / "f-2.ps")]
    every = [node0 / f"f-{i}.ps" for i in range(N)]
    assert patchstore.RankLocalShards(every, 0, 2, seed=1).paths(5) == [str(every[0]), str(every[2])]
    # Pickles (DataLoader workers) with what it found.
    back = pickle.loads(pickle.dumps(patchstore.RankLocalShards(node0, 0, 2, seed=1)))
    assert back.paths() == [str(node0 / "f-0.ps"), str(node0 / "f-2.ps")]


def test_missing_assigned_shard_is_a_clear_error(shard_set, tmp_path):
    base, root, set_dir = shard_set
    node = _node(set_dir, tmp_path / "node", [0, 2])
    wrong = patchstore.RankLocalShards(node, 1, 2, seed=1)  # rank 1 needs shards 1 and 3
    with pytest.raises(FileNotFoundError, match=rf"rank 1 of 2 reads shards 1/4, 3/4 in epoch 0 and every "
                                                rf"other \(assign='fixed', seed 1\), but no store under "
                                                rf"'{node}' is one of them \(shards found: 0, 2\)"):
        wrong.open(0)
    with pytest.raises(FileNotFoundError, match=r"rank 1 of 2 reads shards 1/4, 3/4"):
        wrong.sampler(["rgb"], 8, even=None)
    # per_epoch: fine in the epochs that deal this node's shards to it, an error naming the epoch otherwise.
    full = patchstore.RankLocalShards(set_dir, 0, 2, seed=1, assign="per_epoch")
    mine = full.assignment(0)
    node_pe = _node(set_dir, tmp_path / "node-pe", mine)
    pe = patchstore.RankLocalShards(node_pe, 0, 2, seed=1, assign="per_epoch")
    bad = [e for e in range(8) if full.assignment(e) != mine]
    good = [e for e in range(8) if full.assignment(e) == mine]
    assert bad and good == [0] + good[1:]
    assert pe.paths(0) == [str(node_pe / f"f-{i}.ps") for i in mine]
    e = bad[0]
    need = [i for i in full.assignment(e) if i not in mine]
    with pytest.raises(FileNotFoundError, match=rf"rank 0 of 2 reads shards? {need[0]}/4.* in epoch {e} "
                                                rf"\(assign='per_epoch', seed 1\), but no store under '{node_pe}'"):
        pe.open(e)
    # A list of paths: where it looked is said too.
    with pytest.raises(FileNotFoundError, match=r"among the 4 paths given \(2 of them absent\)"):
        patchstore.RankLocalShards([node / f"f-{i}.ps" for i in range(N)], 1, 2, seed=1).paths()
    with pytest.raises(FileNotFoundError, match="no store at or under"):
        patchstore.RankLocalShards(tmp_path / "empty", 0, 1)
    with pytest.raises(FileNotFoundError, match="none of the 2 stores given exists"):
        patchstore.RankLocalShards([tmp_path / "a.ps", tmp_path / "b.ps"], 0, 1)


def test_shards_of_one_set_only(shard_set, tmp_path):
    base, root, set_dir = shard_set
    twin = _node(set_dir, tmp_path / "twin", [1])
    with pytest.raises(ValueError, match=rf"'{set_dir}/f-1.ps' and '{twin}/f-1.ps' are both shard 1/4"):
        patchstore.RankLocalShards([set_dir / "f-0.ps", set_dir / "f-1.ps", twin / "f-1.ps"], 0, 1)
    other = str(tmp_path / "half-0.ps")
    patchstore.ingest_images(other, root=root, fields=TEMPLATES, shard=(0, 2), durable=False, progress=False)
    with pytest.raises(ValueError, match=rf"'{set_dir}/f-0.ps' is a shard of 4 but '{other}' is shard 0/2 "
                                         r"\(stores of two different shard sets\)"):
        patchstore.RankLocalShards([set_dir / "f-0.ps", other], 0, 1)
    whole = str(tmp_path / "whole.ps")
    patchstore.ingest_images(whole, root=root, fields=TEMPLATES, durable=False, progress=False)
    with pytest.raises(ValueError, match=rf"'{whole}' is not a shard \(ingested without --shard\)"):
        patchstore.RankLocalShards([set_dir / "f-0.ps", whole], 0, 1)


def test_state_checks(shard_set):
    base, root, set_dir = shard_set
    rl = patchstore.RankLocalShards(set_dir, 1, 2, seed=7)
    state = rl.state_dict()
    assert state == {"shard_count": 4, "world_size": 2, "rank": 1, "seed": 7, "assign": "fixed"}
    rl.load_state_dict(state)
    patchstore.RankLocalShards(set_dir, 0, 2, seed=7).load_state_dict(state)  # another rank: same deal
    for other, msg in ((dict(seed=8), "seed=7, this run has seed=8"),
                       (dict(assign="per_epoch"), "assign='fixed', this run has assign='per_epoch'")):
        with pytest.raises(ValueError, match=msg):
            patchstore.RankLocalShards(set_dir, 1, 2, **{"seed": 7, **other}).load_state_dict(state)
    with pytest.raises(ValueError, match="world_size=2, this run has world_size=4"):
        patchstore.RankLocalShards(set_dir, 1, 4, seed=7).load_state_dict(state)
    with pytest.raises(ValueError, match="shard_count=3, this run has shard_count=4"):
        rl.load_state_dict({**state, "shard_count": 3})
    old = {"shard_count": 4, "world_size": 2, "rank": 1, "seed": 7}  # saved before assign existed
    patchstore.RankLocalShards(set_dir, 1, 2, seed=7, assign="per_epoch").load_state_dict(old)
    with pytest.raises(ValueError, match="assign='per_epoch', this run has assign='fixed'"):
        rl.load_state_dict(old)


def _served(s: "patchstore.RankLocalSampler", batch: int = 5) -> List[str]:
    """The ids of every window one epoch serves, batch by batch, checked against the pixels."""
    ids: List[str] = []
    while s.remaining:
        got, wins = s.batch(min(batch, s.remaining), return_windows=True)
        want = s.sampler.gather_windows(wins)
        for f in got:
            np.testing.assert_array_equal(got[f], want[f])
        ids += wins.ids
    return ids


@pytest.mark.parametrize("assign", ["fixed", "per_epoch"])
def test_equal_epoch_lengths_over_unequal_shards(shard_set, assign):
    """even='pad' / 'truncate' without a process group (every shard reachable): exact counts, coverage."""
    base, root, set_dir = shard_set
    everything = sorted(patchstore.open(set_dir).ids)
    ranks = [patchstore.RankLocalShards(set_dir, r, 2, seed=1, assign=assign) for r in range(2)]
    k = 2
    for even in ("pad", "truncate", None):
        samplers = [rl.sampler(["rgb", "mask"], 8, k, even=even, seed=4) for rl in ranks]
        for epoch in range(3):
            for s in samplers:
                s.set_epoch(epoch)
            own = [sum(SIZES[i] for i in rl.assignment(epoch)) * k for rl in ranks]
            assert [s.own_windows for s in samplers] == own and own[0] != own[1]
            want = {"pad": [max(own)] * 2, "truncate": [min(own)] * 2, None: own}[even]
            assert [len(s) for s in samplers] == want
            served = [_served(s) for s in samplers]
            assert [len(x) for x in served] == want
            for s, ids, n_own in zip(samplers, served, own):
                assert ids == s.windows().ids
                plain = s.sampler.windows(epoch).ids  # the rank's own epoch, as PatchSampler serves it
                assert ids == [plain[w % n_own] for w in range(len(s))]  # padding repeats from the start
            counts = Counter(served[0] + served[1])
            if even == "truncate":
                assert all(c <= k for c in counts.values())  # at most once (k windows per visit)
                assert sum(counts.values()) == 2 * min(own)
            else:
                assert sorted(counts) == everything  # every sample at least once
                assert all(c >= k for c in counts.values())
                if even is None:
                    assert all(c == k for c in counts.values())


def test_rank_local_sampler_edges(shard_set, tmp_path):
    base, root, set_dir = shard_set
    node = _node(set_dir, tmp_path / "node", [0, 2])
    # Only local shards and no process group: a common length cannot be known.
    with pytest.raises(RuntimeError, match=r"even='pad'.*initialise torch.distributed.*rank 1 of 2 reads shards "
                                           r"1/4, 3/4"):
        patchstore.RankLocalShards(node, 0, 2, seed=1).sampler(["rgb"], 8)
    # One rank: its own length, nothing to agree on.
    assert len(patchstore.RankLocalShards(set_dir, 0, 1).sampler(["rgb"], 8, even="truncate")) == 24
    s = patchstore.RankLocalShards(set_dir, 0, 2, seed=1).sampler(["rgb"], 8, even="pad")
    assert (len(s), s.own_windows, s.epoch) == (16, 8, 0)
    with pytest.raises(ValueError, match="rank is not an option here"):
        patchstore.RankLocalShards(set_dir, 0, 2, seed=1).sampler(["rgb"], 8, rank=1)
    with pytest.raises(ValueError, match="even must be 'pad', 'truncate' or None, got 'max'"):
        patchstore.RankLocalShards(set_dir, 0, 2, seed=1).sampler(["rgb"], 8, even="max")
    s.batch(10)
    with pytest.raises(ValueError, match=r"batch\(7\): epoch 0 has 6 of its 16 windows left on rank 0; .*"
                                         r"set_epoch\(1\)"):
        s.batch(7)
    back = pickle.loads(pickle.dumps(s))  # DataLoader workers, checkpoints: same position, same windows
    assert (len(back), back.cursor) == (16, 10) and back.windows().ids == s.windows().ids
    state = s.state_dict()
    assert state == {"shard_count": 4, "world_size": 2, "rank": 0, "seed": 1, "assign": "fixed", "even": "pad",
                     "epoch": 0, "cursor": 10, "length": 16}
    rest = s.batch(6, return_windows=True)[1].ids
    again = patchstore.RankLocalShards(set_dir, 0, 2, seed=1).sampler(["rgb"], 8, even="pad")
    again.load_state_dict(state)
    assert again.batch(6, return_windows=True)[1].ids == rest and again.remaining == 0
    with pytest.raises(ValueError, match="even='pad', this run has even='truncate'"):
        patchstore.RankLocalShards(set_dir, 0, 2, seed=1).sampler(["rgb"], 8, even="truncate").load_state_dict(state)
    # out= buffers: written in place; a wrong shape is refused.
    out = {"rgb": np.zeros((16, 3, 8, 8), np.float32)}
    s.set_epoch(2)
    assert s.batch(16, out=out)["rgb"] is out["rgb"]
    np.testing.assert_array_equal(out["rgb"], s.gather(0, 16)["rgb"])
    with pytest.raises(ValueError, match=r"out\['rgb'\] must be .* of shape \(4, 3, 8, 8\)"):
        s.gather(0, 4, out={"rgb": np.zeros((5, 3, 8, 8), np.float32)})
    with pytest.raises(IndexError, match=r"windows \[10, 20\) outside the epoch's 16 windows"):
        s.gather(10, 10)
