"""Resuming mid-epoch: stop after k batches, load the state in a fresh process, get the rest of the run.

For BatchLoader, PatchDataset and SliceDataset, with 0 and 2 DataLoader
workers, fork and spawn, on both ranks of world_size 2: the batches before
the stop followed by those of the fresh process equal, array for array,
the batches of an uninterrupted run of the same two epochs.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import h5py
import numpy as np
import pytest

import patchstore
from patchstore.torch import BatchLoader, PatchDataset, SliceDataset

from resume_child import arrays, build

HERE = Path(__file__).resolve().parent
EPOCHS = 2
STOP_AFTER = 2  # batches of epoch 0 consumed before the "preemption"


@pytest.fixture(scope="module")
def volume_store(tmp_path_factory) -> str:
    """2 patients of 12x12 with 5 and 4 slices (9 slices in all)."""
    base = tmp_path_factory.mktemp("resume_vols")
    rng = np.random.default_rng(7)
    src = base / "v.h5"
    with h5py.File(src, "w") as f:
        for g in ("MR", "CT"):
            grp = f.create_group(g)
            for name, s in (("p1", 5), ("p2", 4)):
                grp.create_dataset(name, data=rng.integers(-1000, 1000, (12, 12, s)).astype(np.int16))
    store = str(base / "v.ps")
    patchstore.ingest_hdf5(src, store, groups=("MR", "CT"), durable=False, progress=False)
    return store


def stores(kind: str, frameset, volume_store) -> str:
    return volume_store if kind == "slice" else frameset.store


def uninterrupted(cfg: Dict[str, Any]) -> List[List[np.ndarray]]:
    obj, loader = build(dict(cfg, workers=0, stateful=False))
    out = []
    for epoch in range(EPOCHS):
        obj.set_epoch(epoch)
        out += [arrays(b) for b in loader]
    return out


def stop(cfg: Dict[str, Any]):
    """Runs epoch 0 for STOP_AFTER batches; returns (batches, state) as the training loop would save it."""
    obj, loader = build(cfg)
    obj.set_epoch(0)
    got = []
    it = iter(loader)
    for _ in range(STOP_AFTER):
        got.append(arrays(next(it)))
    if cfg.get("stateful"):
        state = {"loader": loader.state_dict(), "epoch": 0}
    elif cfg["kind"] == "batch" and cfg["workers"] == 0:
        state = obj.state_dict()  # iterated directly: the loader counted the batches
    elif cfg["kind"] == "batch":
        state = obj.state_dict(epoch=0, batch=STOP_AFTER)  # plain DataLoader: the loop's count
    else:
        state = obj.state_dict(batch=STOP_AFTER)
    del it, loader
    return got, state


def resume_in_fresh_process(jobs, tmp_path) -> List[List[List[np.ndarray]]]:
    src, dst = tmp_path / "jobs.pkl", tmp_path / "out.pkl"
    with open(src, "wb") as f:
        pickle.dump(jobs, f)
    r = subprocess.run([sys.executable, str(HERE / "resume_child.py"), str(src), str(dst)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(dst, "rb") as f:
        return pickle.load(f)


def assert_same_run(expected, got, what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} batches, the uninterrupted run has {len(expected)}"
    for b, (e, g) in enumerate(zip(expected, got)):
        assert len(e) == len(g)
        for x, y in zip(e, g):
            assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True), f"{what}: batch {b} differs"


def run_matrix(cfgs, tmp_path, stop_method=None) -> None:
    stopped = [stop(dict(cfg, method=stop_method or cfg["method"])) for cfg in cfgs]
    for (_, state) in stopped:
        json.dumps(state)  # plain ints and strings
        assert len(pickle.dumps(state)) < 4096
    rest = resume_in_fresh_process([(cfg, state) for cfg, (_, state) in zip(cfgs, stopped)], tmp_path)
    for cfg, (before, state), after in zip(cfgs, stopped, rest):
        what = f"{cfg['kind']} workers={cfg['workers']} {cfg.get('method')} rank {cfg['rank']}"
        if not cfg.get("stateful"):
            assert (state["epoch"], state["batch"]) == (0, STOP_AFTER), what
        assert_same_run(uninterrupted(cfg), before + after, what)


@pytest.mark.parametrize("kind", ["batch", "patch", "slice"])
def test_resume_in_a_fresh_process_equals_an_uninterrupted_run(kind, frameset, volume_store, tmp_path):
    """Forked workers: 0 and 2 workers, both ranks."""
    store = stores(kind, frameset, volume_store)
    cfgs = [{"kind": kind, "store": store, "rank": r, "world_size": 2, "workers": w, "method": "fork",
             "epochs": EPOCHS} for w in (0, 2) for r in (0, 1)]
    run_matrix(cfgs, tmp_path)


def test_resume_with_spawned_workers(frameset, volume_store, tmp_path):
    """Spawned workers (the restored state reaches them pickled), every loader, in one fresh process.

    A spawned worker imports torch anew (seconds each), so: rank 1 of 2 only (rank 0 differs in the
    windows it draws, covered under fork), and the run before the stop uses forked workers (its state
    is the loop's count, whatever the workers; the batches before it equal the uninterrupted ones).
    """
    cfgs = [{"kind": kind, "store": stores(kind, frameset, volume_store), "rank": 1, "world_size": 2,
             "workers": 2, "method": "spawn", "epochs": EPOCHS} for kind in ("batch", "patch", "slice")]
    run_matrix(cfgs, tmp_path, stop_method="fork")


@pytest.mark.parametrize("kind", ["batch", "patch", "slice"])
def test_resume_with_torchdata_stateful_dataloader(kind, frameset, volume_store, tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    store = stores(kind, frameset, volume_store)
    cfgs = [{"kind": kind, "store": store, "rank": 1, "world_size": 2, "workers": w, "method": "fork",
             "epochs": EPOCHS, "stateful": True} for w in (0, 2)]
    run_matrix(cfgs, tmp_path)


def test_training_guide_dataset_recipe(volume_store, tmp_path):
    """The dataset resume recipe of docs/guide/training.md, loop for loop: a state saved after every
    step, runs stopped after 4 and 5 more batches (one stop at an epoch's end), resumed from ckpt.pt;
    the (epoch, step) numbers and batches equal those of an uninterrupted run of 3 epochs."""
    import torch
    from torch.utils.data import DataLoader

    from patchstore.torch import slice_collate

    ckpt_path = tmp_path / "ckpt.pt"

    def run(stop_after):
        seen = []
        ds = SliceDataset(volume_store, fields=("MR", "CT"), crop=8, flip=True, rot90=True)
        loader = DataLoader(ds, batch_sampler=ds.batch_sampler(4, shuffle=True), collate_fn=slice_collate)
        start_epoch, start_batch = 0, 0
        if ckpt_path.exists():
            ckpt = torch.load(ckpt_path)
            ds.load_state_dict(ckpt["data"])
            start_epoch, start_batch = ckpt["data"]["epoch"], ckpt["data"]["batch"]
        for epoch in range(start_epoch, 3):
            ds.set_epoch(epoch)
            first = start_batch if epoch == start_epoch else 0
            for step, (A, B) in enumerate(loader, start=first):
                seen.append(((epoch, step), [A.numpy().copy(), B.numpy().copy()]))
                torch.save({"data": ds.state_dict(batch=step + 1)}, ckpt_path)
                if len(seen) == stop_after:
                    return seen
        return seen

    full = run(None)
    ckpt_path.unlink()
    parts = run(4) + run(5) + run(None)  # 9 slices in batches of 4: 3 batches per epoch
    assert [k for k, _ in full] == [(e, s) for e in range(3) for s in range(3)]
    assert [k for k, _ in parts] == [k for k, _ in full]
    assert_same_run([b for _, b in full], [b for _, b in parts], "training.md recipe")


def test_batch_loader_state_follows_the_iteration(frameset):
    loader = BatchLoader(frameset.store, ["rgb"], patch_size=16, batch_size=4, seed=1)
    nb = len(loader)
    assert nb >= 3
    first = loader.state_dict()
    base = {k: first[k] for k in ("type", "version", "options", "store", "batches")}
    assert (base["type"], base["version"], base["batches"], base["options"]["seed"]) == ("BatchLoader", 3, nb, 1)
    assert first == dict(base, epoch=0, batch=0)
    it = iter(loader)
    next(it)
    next(it)
    assert loader.state_dict() == dict(base, epoch=0, batch=2)
    for _ in it:
        pass
    del _  # the last batch: let its buffer go
    assert loader.state_dict() == dict(base, epoch=1, batch=0)  # a finished epoch: the start of the next
    # Loading a state in the same process: the rest of that epoch, then the next one.
    ref = [arrays(b) for b in loader.batches(1)][1:] + [arrays(b) for b in loader.batches(2)]
    loader.load_state_dict(dict(base, epoch=1, batch=1))
    got = [arrays(b) for b in loader] + [arrays(b) for b in loader]
    assert_same_run(ref, got, "same process")
    # set_epoch with another epoch drops the restored position.
    loader.load_state_dict(dict(base, epoch=1, batch=1))
    loader.set_epoch(2)
    assert_same_run([arrays(b) for b in loader.batches(2)], [arrays(b) for b in loader], "set_epoch")


def test_states_that_do_not_match_are_refused(frameset, volume_store):
    loader = BatchLoader(frameset.store, ["rgb"], patch_size=16, batch_size=4, seed=1)
    good = loader.state_dict()
    for change, word in (({"options": dict(good["options"], seed=2)}, "seed=2"),
                         ({"options": dict(good["options"], batch_size=8)}, "batch_size=8"),
                         ({"options": dict(good["options"], world_size=2)}, "world_size=2"),
                         ({"store": "0" * 16}, "another store"), ({"batches": 7}, "batches=7"),
                         ({"type": "SliceDataset"}, "SliceDataset"),
                         ({"version": 9}, "version 9"), ({"version": 1}, "older patchstore whose epoch order"),
                         ({"epoch": -1}, ">= 0"), ({"batch": "3"}, "int")):
        with pytest.raises(ValueError, match=word):
            loader.load_state_dict(dict(good, **change))
    with pytest.raises(ValueError, match="worker 0 of 2"):
        loader.load_state_dict(dict(good, worker=0, num_workers=2))
    with pytest.raises(TypeError):
        loader.load_state_dict([1, 2])
    ds = SliceDataset(volume_store, ("MR",), seed=4)
    ds.set_epoch(3)
    ds.batch_sampler(2)
    state = ds.state_dict(batch=5)
    assert (state["type"], state["version"], state["options"]["seed"], state["length"], state["epoch"],
            state["batch"]) == ("SliceDataset", 3, 4, 9, 3, 5)
    with pytest.raises(ValueError, match="length=20"):
        ds.load_state_dict(dict(ds.state_dict(), length=20))
    pd = PatchDataset(frameset.store, ["rgb"], 16)
    with pytest.raises(ValueError, match="saved by 'SliceDataset'"):
        pd.load_state_dict(ds.state_dict())


def test_epoch_batch_sampler_splits_like_distributed_sampler(volume_store):
    ds = SliceDataset(volume_store, ("MR",), seed=4)  # 9 items
    s0 = ds.batch_sampler(2, shuffle=True, rank=0, world_size=2)
    s1 = ds.batch_sampler(2, shuffle=True, rank=1, world_size=2)
    assert len(s0) == len(s1) == 3  # 5 items per rank (one padded), batches 2, 2, 1
    ds.set_epoch(0)
    a, b = list(s0), list(s1)
    assert [len(x) for x in a] == [2, 2, 1]
    mine = sum(a, []) + sum(b, [])
    assert sorted(set(mine)) == list(range(9)) and len(mine) == 10  # every index, one repeated (padding)
    ds.set_epoch(1)
    assert list(s0) != a  # a new order each epoch ...
    ds.set_epoch(0)
    assert list(s0) == a  # ... a function of the epoch only
    plain = ds.batch_sampler(4, shuffle=False, drop_last=True)
    assert list(plain) == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(plain) == 2
    ds.load_state_dict(ds.state_dict(batch=1))
    assert list(plain) == [[4, 5, 6, 7]]  # resumed once ...
    assert list(plain) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # ... then whole epochs again


def _splitmix_shuffle(n: int, seed: int, epoch: int, salt: int) -> List[int]:
    """Reference for the C++ epoch order: Fisher-Yates with j = Below(Key(seed, epoch, salt, i, 0), i)."""
    m = (1 << 64) - 1

    def mix(z: int) -> int:
        z = (z + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    def key(*xs: int) -> int:
        h = xs[0]
        for x in xs[1:]:
            h = mix(h) ^ x
        return mix(h)

    v = list(range(n))
    for i in range(n, 1, -1):
        j = (key(seed, epoch, salt, i, 0) * i) >> 64
        v[i - 1], v[j] = v[j], v[i - 1]
    return v


def test_epoch_order_is_the_cpp_generators_shuffle(volume_store):
    """EpochBatchSampler's order comes from splitmix::Shuffle (salt 'EBS1'), not NumPy: pinned by a reference."""
    from patchstore import _patchstore as C
    from patchstore._resume import EpochBatchSampler
    ds = SliceDataset(volume_store, ("MR",), seed=4)
    sampler = EpochBatchSampler(ds, batch_size=3, shuffle=True, rank=0, world_size=1)
    for epoch in (0, 1, 7):
        assert sampler.order(epoch).tolist() == _splitmix_shuffle(len(ds), 4, epoch, 0x45425331)
    assert sampler.order(0).tolist() != sampler.order(1).tolist()
    v = np.arange(10, dtype=np.int64)
    C.shuffle(v, 3, 5, 7)
    assert v.tolist() == _splitmix_shuffle(10, 3, 5, 7) and sorted(v.tolist()) == list(range(10))
    with pytest.raises(ValueError, match="int64"):
        C.shuffle(np.arange(4, dtype=np.float32), 0, 0, 0)
