"""Epochs, batches and steps outside the range the engine represents ([0, 2**63)) are refused, naming the value,
by set_epoch, load_state_dict, state_dict, constructors and gathers: never wrapped (2**64 + 5 served epoch 5) nor
passed on as a negative int64."""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np
import pytest

import patchstore
from patchstore.torch import BatchLoader, PatchDataset, SliceDataset

BAD = [2**63, 2**64 + 11, 2**70, -2]


@pytest.fixture(scope="module")
def volumes(tmp_path_factory):
    d = tmp_path_factory.mktemp("vols")
    rng = np.random.default_rng(8)
    with h5py.File(d / "v.h5", "w") as f:
        for g in ("MR", "CT"):
            f.create_dataset(f"{g}/p1", data=rng.integers(0, 500, (9, 10, 4)).astype(np.int16))
    patchstore.ingest_hdf5(d / "v.h5", d / "v.ps", groups=["MR", "CT"], durable=False, progress=False)
    return str(d / "v.ps")


@pytest.mark.parametrize("bad", BAD)
def test_set_epoch_refuses_values_outside_the_range(frameset, volumes, bad):
    loaders = [patchstore.PatchSampler(frameset.store, ["rgb"], 8),
               PatchDataset(frameset.store, ["rgb"], 8),
               SliceDataset(volumes, ["MR", "CT"]),
               BatchLoader(frameset.store, ["rgb"], 8, batch_size=2)]
    for loader in loaders:
        with pytest.raises(ValueError, match=rf"epoch must be >= 0 and < 2\*\*63 .*got {bad}$"):
            loader.set_epoch(bad)
        assert loader.epoch == 0, type(loader).__name__  # unchanged
    s = loaders[0]
    with pytest.raises(ValueError, match=f"got {bad}$"):
        s.gather(bad, 0, 1)
    with pytest.raises(ValueError, match=f"got {bad}$"):
        s.window(bad, 0)
    with pytest.raises(ValueError, match=f"got {bad}$"):
        loaders[3].batches(bad)
    with pytest.raises(ValueError, match=f"montage: epoch must be .*got {bad}$"):
        patchstore.open(frameset.store).montage(count=1, patch_size=8, field="rgb", epoch=bad)


def test_the_largest_epoch_is_accepted(frameset):
    s = patchstore.PatchSampler(frameset.store, ["rgb"], 8)
    s.set_epoch(2**63 - 1)
    assert s.epoch == 2**63 - 1
    ds = PatchDataset(frameset.store, ["rgb"], 8)
    ds.set_epoch(2**63 - 1)
    assert ds.epoch == 2**63 - 1


LAST = 2**63 - 1


@pytest.mark.parametrize("workers", [0, 2])
def test_iteration_stops_after_the_last_epoch(frameset, workers):
    # A BatchLoader at set_epoch(2**63 - 1) went on into epochs 2**63, 2**63 + 1, ... and served batches there;
    # its state_dict() then said epoch=2**63, which its own load_state_dict refused.
    from torch.utils.data import DataLoader
    loader = BatchLoader(frameset.store, ["rgb"], 8, batch_size=2)
    nb = len(loader)
    loader.set_epoch(LAST)
    it: Any = loader if workers == 0 else DataLoader(loader, batch_size=None, num_workers=workers,
                                                         multiprocessing_context="fork")
    assert sum(1 for _ in it) == nb
    batches = None
    with pytest.raises(RuntimeError, match=rf"epoch {LAST} \(2\*\*63 - 1\), the last epoch .* has been served"):
        batches = iter(it)  # (BatchLoader's iter() raises; a DataLoader's next() does)
        next(batches)
    # A DataLoader's iterator, held by the traceback: stop its workers now (collected later, torch waits 10 s).
    getattr(batches, "_shutdown_workers", lambda: None)()
    if workers == 0:
        state = loader.state_dict()  # the end of the last epoch (it has no next one to start)
        assert (state["epoch"], state["batch"]) == (LAST, nb)
        again = BatchLoader(frameset.store, ["rgb"], 8, batch_size=2)
        again.load_state_dict(state)
        assert list(again) == []
        with pytest.raises(RuntimeError, match="there is no next epoch"):
            iter(again)
        assert loader.state_dict(epoch=LAST, batch=nb)["epoch"] == LAST
    loader.set_epoch(3)  # set_epoch starts again
    assert sum(1 for _ in it) == nb


def test_patch_sampler_batches_stop_after_the_last_epoch(frameset):
    # batch() continues into the next epoch: from 2**63 - 1 it served windows of epoch 2**63 (C++ uint64).
    s = patchstore.PatchSampler(frameset.store, ["rgb"], 8)
    n = len(s)
    s.set_epoch(LAST)
    s.batch(n - 1)
    with pytest.raises(ValueError, match=rf"batch\(2\) would serve windows after epoch {LAST} \(2\*\*63 - 1\), "
                                         rf"the last epoch the sampler represents \(it is at window {n - 1} of epoch "
                                         rf"{LAST}"):
        s.batch(2)
    assert (s.epoch, s.cursor) == (LAST, n - 1)  # unchanged
    s.batch(1)  # the last window of the last epoch
    with pytest.raises(ValueError, match=rf"batch\(1\) would serve windows after epoch {LAST}"):
        s.batch(1)
    s.set_epoch(0)
    s.batch(n + 1)


def test_a_mid_epoch_state_of_the_last_epoch_keeps_the_sampler_check(frameset, volumes):
    # The pending position was kept as epoch + 1 in an int64: at epoch 2**63 - 1 it wrapped to -2**63 and the
    # check that refuses items read by another sampler (DataLoader(ds, shuffle=True)) was off.
    for ds in (PatchDataset(frameset.store, ["rgb"], 8), SliceDataset(volumes, ["MR", "CT"])):
        bs = ds.batch_sampler(2, shuffle=True)
        ds.set_epoch(LAST)
        ds.load_state_dict(ds.state_dict(batch=1))
        with pytest.raises(RuntimeError, match=f"a state saved at batch 1 of epoch {LAST} was loaded"):
            ds[0]
        assert list(bs) == list(bs.batches(LAST))[1:]
        ds[0]  # the batch sampler took the position


@pytest.mark.parametrize("key,bad", [("epoch", 2**64 + 5), ("epoch", 2**63), ("batch", 2**63 + 3), ("batch", -1)])
def test_load_state_dict_refuses_tampered_positions(frameset, key, bad):
    ds = PatchDataset(frameset.store, ["rgb"], 8)
    ds.batch_sampler(2)  # a mid-epoch state needs the dataset's own batch sampler
    state = ds.state_dict(batch=1)
    state[key] = bad
    with pytest.raises(ValueError, match=rf"PatchDataset.load_state_dict: {key} must be >= 0 .*got {bad}$"):
        ds.load_state_dict(state)
    assert ds.epoch == 0
    with pytest.raises(ValueError, match=f"PatchDataset.state_dict: batch must be .*got {2**63}$"):
        ds.state_dict(batch=2**63)
    loader = BatchLoader(frameset.store, ["rgb"], 8, batch_size=2)
    state = loader.state_dict(epoch=3, batch=1)
    state[key] = bad
    with pytest.raises(ValueError, match=rf"BatchLoader.load_state_dict: {key} must be >= 0 .*got {bad}$"):
        loader.load_state_dict(state)
    with pytest.raises(ValueError, match=f"BatchLoader.state_dict: epoch must be .*got {2**64}$"):
        loader.state_dict(epoch=2**64, batch=0)


def test_rank_local_sampler_refuses_epochs_outside_the_range(frameset, tmp_path):
    # A set of two shards of the frames (Python ingest).
    from conftest import TEMPLATES
    for i in range(2):
        patchstore.ingest_images(str(tmp_path / f"f-{i}.ps"), root=str(frameset.root), fields=TEMPLATES,
                                 shard=(i, 2), durable=False, progress=False)
    shards = patchstore.RankLocalShards(str(tmp_path), 0, 1)
    with pytest.raises(ValueError, match=rf"RankLocalSampler: epoch must be .*got {2**64 + 3}$"):
        shards.sampler(["rgb"], 8, epoch=2**64 + 3)
    s = shards.sampler(["rgb"], 8, epoch=4)
    with pytest.raises(ValueError, match=rf"RankLocalSampler: epoch must be .*got {2**63}$"):
        s.set_epoch(2**63)
    state = s.state_dict()
    state["epoch"] = 2**64 + 4
    with pytest.raises(ValueError, match=rf"RankLocalSampler.load_state_dict: epoch must be .*got {2**64 + 4}$"):
        s.load_state_dict(state)
    assert s.epoch == 4


@pytest.mark.parametrize("bad", [2**63 + 9, 2**64 + 2, -3])
def test_batch_sampler_order_refuses_epochs_outside_the_range(frameset, volumes, bad):
    # order(epoch) is public (what a custom loop reads); 2**63 + 9 used to be shuffled as an unsigned
    # epoch and 2**64 + 2 ended in a pybind TypeError.
    for ds in (PatchDataset(frameset.store, ["rgb"], 8), SliceDataset(volumes, ["MR", "CT"])):
        bs = ds.batch_sampler(3, shuffle=True)
        with pytest.raises(ValueError, match=rf"^epoch must be >= 0 and < 2\*\*63 .*got {bad}$"):
            bs.order(bad)
        with pytest.raises(ValueError, match=f"got {bad}$"):
            next(bs.batches(bad))
        assert sorted(bs.order(2**63 - 1).tolist()) == list(range(len(ds)))
        # A negative start yielded an empty batch first, then the whole epoch.
        with pytest.raises(ValueError, match=r"^start must be >= 0 and < 2\*\*63 .*got -1$"):
            next(bs.batches(0, -1))
        assert list(bs.batches(0, len(bs))) == [] and len(list(bs.batches(0, 1))) == len(bs) - 1
