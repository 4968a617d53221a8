"""A resume that cannot go silently wrong: states record the served options and the store's identity.

Each recorded option changed in turn is refused naming it and both values (BatchLoader, PatchDataset,
SliceDataset); another store of the same length is refused, a re-laid-out copy of the same store is
not; states saved before options were recorded (version 2) still load; a mid-epoch state read through
DataLoader(ds, shuffle=True) raises (0 and 2 workers) instead of serving a different, full epoch; the
exact form, DataLoader(ds, batch_sampler=ds.batch_sampler(B)), resumes exactly.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import numpy as np
import pytest
from torch.utils.data import DataLoader

import patchstore
from patchstore.torch import BatchLoader, PatchDataset, SliceDataset, collate, slice_collate

import test_golden as golden
from conftest import write_png

pytestmark = pytest.mark.filterwarnings("ignore:.*skipping 1 of:RuntimeWarning")


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> str:
    return golden.frame_store(tmp_path_factory.mktemp("rc_rows"), "rows")


@pytest.fixture(scope="module")
def tiles(tmp_path_factory) -> str:
    """The same frames as `frames`, laid out in tiles: the same ids, shapes and masks."""
    return golden.frame_store(tmp_path_factory.mktemp("rc_tiles"), "tiles")


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> str:
    """Another store of the same length (6 frames, same size) under other ids."""
    base = tmp_path_factory.mktemp("rc_other")
    for i in range(6):
        rgb, mask = golden.frame(i)
        write_png(base / "data" / f"w/{i:04}.rgb.png", rgb)
        write_png(base / "data" / f"w/{i:04}.mask.png", mask)
    store = str(base / "other.ps")
    patchstore.ingest_images(store, root=str(base / "data"),
                             fields={"rgb": "{video}/{frame}.rgb.png", "mask": "{video}/{frame}.mask.png"},
                             masks=["mask"], durable=False, progress=False)
    return store


@pytest.fixture(scope="module")
def volumes(tmp_path_factory) -> str:
    return golden.volume_store(tmp_path_factory.mktemp("rc_volumes"))


def arrays(batch: Any) -> List[np.ndarray]:
    parts = batch.values() if isinstance(batch, dict) else batch
    return [t.numpy().copy() for t in parts]


def same(a: List[List[np.ndarray]], b: List[List[np.ndarray]]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y))
                                    for x, y in zip(a, b))


def refused(loader: Any, state: Dict[str, Any], key: str, what: str) -> None:
    """load_state_dict(state) raises naming `key` with the state's value and the loader's."""
    mine = loader.state_dict()["options"]
    saved = state["options"]
    assert saved.get(key) != mine.get(key)
    with pytest.raises(ValueError) as e:
        loader.load_state_dict(state)
    msg = str(e.value)
    assert f"the state was saved with {key}={saved[key]!r}, this {what} has {key}={mine[key]!r}" in msg, msg


BATCH_BASE: Dict[str, Any] = dict(fields=["rgb", "mask"], patch_size=6, batch_size=2, require="mask", seed=3)
BATCH_CHANGES = [
    ("fields", {"fields": ["rgb"]}),
    ("patch_size", {"patch_size": 4}),
    ("patch_size", {"patch_size": (6, 4)}),
    ("patches_per_sample", {"patches_per_sample": 2}),
    ("require", {"require": None}),
    ("min_valid", {"min_valid": 2}),
    ("positive_fraction", {"positive_fraction": 0.5}),
    ("policy", {"policy": "min_valid"}),  # what "auto" means here, but recorded as given
    ("flip", {"flip": True}),
    ("rot90", {"rot90": True}),
    ("ids", {"ids": ["v/0000", "v/0001", "v/0003"]}),
    ("seed", {"seed": 4}),
    ("world_size", {"world_size": 2, "rank": 0}),
    ("batch_size", {"batch_size": 3}),
    ("drop_last", {"drop_last": True}),
    ("order", {"order": "locality", "cache_budget": 1 << 20}),  # named before cache_budget
]


@pytest.mark.parametrize("key,change", BATCH_CHANGES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(BATCH_CHANGES)])
def test_batch_loader_refuses_each_other_option(frames, key, change):
    saved = BatchLoader(frames, **BATCH_BASE).state_dict(epoch=0, batch=1)
    refused(BatchLoader(frames, **dict(BATCH_BASE, **change)), saved, key, "BatchLoader")


def test_batch_loader_state_records_every_served_option(frames):
    state = BatchLoader(frames, **BATCH_BASE).state_dict()
    json.dumps(state)
    assert state["options"] == {
        "batch_size": 2, "cache_budget": None, "drop_last": False, "fields": ["rgb", "mask"], "flip": False,
        "ids": None, "min_valid": 1.0, "order": "random", "patch_size": 6, "patches_per_sample": 1,
        "policy": "auto", "positive_fraction": None, "require": "mask", "rot90": False, "seed": 3,
        "world_size": 1}
    # Options that do not change the batches are not recorded: such a state loads.
    BatchLoader(frames, **BATCH_BASE, num_threads=2, prefetch=False).load_state_dict(state)
    # Neither is the rank: one rank's state resumes every rank.
    a = BatchLoader(frames, **dict(BATCH_BASE, rank=0, world_size=2)).state_dict(epoch=0, batch=1)
    BatchLoader(frames, **dict(BATCH_BASE, rank=1, world_size=2)).load_state_dict(a)


PATCH_BASE: Dict[str, Any] = dict(fields=["rgb", "mask"], patch_size=6, require="mask", seed=3)
PATCH_CHANGES = [c for c in BATCH_CHANGES if c[0] not in ("world_size", "batch_size", "drop_last", "order")]


@pytest.mark.parametrize("key,change", PATCH_CHANGES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(PATCH_CHANGES)])
def test_patch_dataset_refuses_each_other_option(frames, key, change):
    ds = PatchDataset(frames, **PATCH_BASE)
    ds.batch_sampler(2)
    saved = ds.state_dict(batch=1)
    refused(PatchDataset(frames, **dict(PATCH_BASE, **change)), saved, key, "PatchDataset")


SLICE_BASE: Dict[str, Any] = dict(fields=("MR", "CT"), crop=6, seed=3)
SLICE_CHANGES = [
    ("fields", {"fields": ("MR",)}),
    ("context", {"context": 1}),
    ("context", {"context": {"MR": 1}}),  # per field: recorded as {"CT": 0, "MR": 1}
    ("crop", {"crop": 4}),
    ("crop", {"crop": None}),
    ("flip", {"flip": True}),
    ("flip", {"flip": "independent"}),
    ("rot90", {"rot90": True}),
    ("seed", {"seed": 4}),
    ("clamp", {"clamp": (-1, 1)}),
    ("ids", {"ids": ["p2", "p0", "p1"]}),  # the same slices, another order: other items
]


@pytest.mark.parametrize("key,change", SLICE_CHANGES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SLICE_CHANGES)])
def test_slice_dataset_refuses_each_other_option(volumes, key, change):
    ds = SliceDataset(volumes, **SLICE_BASE)
    ds.batch_sampler(2)
    saved = ds.state_dict(batch=1)
    refused(SliceDataset(volumes, **dict(SLICE_BASE, **change)), saved, key, "SliceDataset")


def test_batch_sampler_options_are_checked_when_the_epoch_resumes(volumes):
    ds = SliceDataset(volumes, **SLICE_BASE)
    ds.batch_sampler(3, drop_last=True)
    state = ds.state_dict(batch=1)
    assert state["batch_sampler"] == {"batch_size": 3, "shuffle": True, "drop_last": True, "world_size": 1,
                                      "order": "random", "cache_budget": None}
    for kw, word in (({"batch_size": 2, "drop_last": True}, "batch_size=3, this batch sampler has batch_size=2"),
                     ({"batch_size": 3}, "drop_last=True, this batch sampler has drop_last=False"),
                     ({"batch_size": 3, "drop_last": True, "shuffle": False}, "shuffle=True"),
                     ({"batch_size": 3, "drop_last": True, "rank": 0, "world_size": 2}, "world_size=1")):
        new = SliceDataset(volumes, **SLICE_BASE)
        sampler = new.batch_sampler(**kw)
        new.load_state_dict(state)
        with pytest.raises(ValueError, match=word):
            list(sampler)


def test_another_store_of_the_same_length_is_refused(frames, other, tiles):
    assert len(patchstore.Store(frames)) == len(patchstore.Store(other)) == 6
    saved = BatchLoader(frames, **BATCH_BASE).state_dict(epoch=0, batch=1)
    with pytest.raises(ValueError, match=r"saved from another store \(identity '[0-9a-f]{16}'\); this BatchLoader "
                                         r"reads '.*other.ps' \(identity '[0-9a-f]{16}'\)"):
        BatchLoader(other, **BATCH_BASE).load_state_dict(saved)
    ds = PatchDataset(frames, **PATCH_BASE)
    ds.batch_sampler(2)
    with pytest.raises(ValueError, match="another store"):
        PatchDataset(other, **PATCH_BASE).load_state_dict(ds.state_dict(batch=1))
    # The same frames in another layout: the same ids, shapes and masks, the same identity; the state
    # loads and the rest of the epoch is the same batches.
    assert saved["store"] == BatchLoader(tiles, **BATCH_BASE).state_dict()["store"]
    t = BatchLoader(tiles, **BATCH_BASE)
    t.load_state_dict(saved)
    ref = BatchLoader(frames, **BATCH_BASE)
    assert same([arrays(b) for b in t], [arrays(b) for b in ref.batches(0)][1:])


def test_states_saved_before_options_were_recorded_still_load(frames, volumes):
    loader = BatchLoader(frames, **BATCH_BASE)
    nb = len(loader)
    old = {"type": "BatchLoader", "version": 2, "seed": 3, "world_size": 1, "batch_size": 2, "batches": nb,
           "epoch": 0, "batch": 1}
    loader.load_state_dict(old)
    assert same([arrays(b) for b in loader], [arrays(b) for b in BatchLoader(frames, **BATCH_BASE).batches(0)][1:])
    with pytest.raises(ValueError, match="saved with seed=4, this BatchLoader has seed=3"):
        loader.load_state_dict(dict(old, seed=4))
    # A version-2 dataset state: the batch sampler picks up at its batch.
    ds = SliceDataset(volumes, **SLICE_BASE)
    full = [b for b in ds.batch_sampler(2).batches(0)]
    ds.load_state_dict({"type": "SliceDataset", "version": 2, "seed": 3, "length": len(ds), "epoch": 0,
                        "batch": 2})
    assert list(ds.batch_sampler(2)) == full[2:]
    with pytest.raises(ValueError, match="length=5"):
        ds.load_state_dict({"type": "SliceDataset", "version": 2, "seed": 3, "length": 5, "epoch": 0, "batch": 2})


def test_a_batch_past_the_end_of_the_epoch_is_refused(frames, volumes, monkeypatch):
    # batch 7 of a 5-batch epoch (or 10**6) was accepted and served an empty epoch; batch == batches is the
    # end of the epoch (the state a loop saves after its last step) and loads.
    loader = BatchLoader(frames, **BATCH_BASE)
    nb = len(loader)
    full = [arrays(b) for b in loader.batches(0)]
    state = loader.state_dict()
    for bad in (nb + 1, nb + 2, 10**6):
        with pytest.raises(ValueError, match=rf"^BatchLoader.load_state_dict: batch={bad} is past the end of epoch "
                                             rf"0: an epoch of this BatchLoader has {nb} batches \(batch {nb} is"):
            loader.load_state_dict(dict(state, batch=bad))
    assert same([arrays(b) for b in loader], full)  # untouched by the refusals
    loader.load_state_dict(dict(state, epoch=6, batch=nb))
    assert list(loader) == [] and loader.epoch == 7
    # A worker's state (StatefulDataLoader): worker 1 of 3 reads batches 1, 4, 7, ...; its next one after the
    # epoch is at most nb + 2.
    import torch.utils.data
    info = type("Info", (), {"id": 1, "num_workers": 3})()
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)
    worker = dict(state, worker=1, num_workers=3)
    loader.load_state_dict(dict(worker, batch=nb + 2))
    with pytest.raises(ValueError, match=rf"batch={nb + 3} is past the end of epoch 0: an epoch of this BatchLoader "
                                         rf"\(worker 1 of 3\) has {nb} batches"):
        loader.load_state_dict(dict(worker, batch=nb + 3))
    monkeypatch.undo()
    # The datasets: the batch sampler their state records gives the batches per epoch.
    for ds in (PatchDataset(frames, **PATCH_BASE), SliceDataset(volumes, **SLICE_BASE)):
        what = type(ds).__name__
        bs = ds.batch_sampler(2)
        ds.set_epoch(2)
        state = ds.state_dict(batch=1)
        for bad in (len(bs) + 1, 10**6):
            with pytest.raises(ValueError, match=rf"^{what}.load_state_dict: batch={bad} is past the end of epoch 5: "
                                                 rf"an epoch of its batch sampler has {len(bs)} batches"):
                ds.load_state_dict(dict(state, batch=bad, epoch=5))
            assert ds.epoch == 2, what  # unchanged
        ds.load_state_dict(dict(state, batch=len(bs)))
        assert list(ds.batch_sampler(2)) == [], what
    # A version-2 state records no batch size: its batch sampler refuses when it takes the position.
    ds = SliceDataset(volumes, **SLICE_BASE)
    ds.load_state_dict({"type": "SliceDataset", "version": 2, "seed": 3, "length": len(ds), "epoch": 0, "batch": 9})
    bs = ds.batch_sampler(2)
    with pytest.raises(ValueError, match=rf"^SliceDataset.batch_sampler: the loaded state: batch=9 is past the end "
                                         rf"of epoch 0: an epoch of this batch sampler has {len(bs)} batches"):
        list(bs)


def test_a_current_state_with_another_version_is_refused_naming_the_version(frames, volumes):
    # Only `version` changed (3 -> 2) was refused as "saved with seed=None, this BatchLoader has seed=3" though
    # the state holds seed=3 (in its options): a version-2 state has its keys at the top level.
    loaders = [BatchLoader(frames, **BATCH_BASE), PatchDataset(frames, **PATCH_BASE),
               SliceDataset(volumes, **SLICE_BASE)]
    for loader in loaders:
        what = type(loader).__name__
        state = loader.state_dict()
        with pytest.raises(ValueError, match=rf"^{what}.load_state_dict: the state says version 2 but holds "
                                             rf"'options', 'store', which only version-3 states hold"):
            loader.load_state_dict(dict(state, version=2))
        with pytest.raises(ValueError, match=rf"{what}.load_state_dict: state version 4 is not supported"):
            loader.load_state_dict(dict(state, version=4))
    # A version-2 state without one of its keys names the key, not "saved with seed=None".
    old = {"type": "BatchLoader", "version": 2, "world_size": 1, "batch_size": 2, "batches": len(loaders[0]),
           "epoch": 0, "batch": 1}
    with pytest.raises(ValueError, match=r"^BatchLoader.load_state_dict: this version-2 state has no 'seed' "):
        loaders[0].load_state_dict(old)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["patch", "slice"])
def test_mid_epoch_resume_through_another_sampler_is_refused(frames, volumes, kind, workers):
    def make():
        if kind == "patch":
            return PatchDataset(frames, **PATCH_BASE), collate
        return SliceDataset(volumes, **SLICE_BASE), slice_collate

    ds, fn = make()
    # No batch sampler: a batch count names no position.
    with pytest.raises(ValueError, match=r"no batch_sampler\(\) of this dataset was made"):
        ds.state_dict(batch=2)
    assert ds.state_dict()["batch"] == 0  # an epoch start is fine
    ds.batch_sampler(2)
    state = ds.state_dict(batch=2)
    kw = dict(num_workers=workers, multiprocessing_context="fork") if workers else {}

    new, _ = make()
    new.load_state_dict(state)
    loader = DataLoader(new, batch_size=2, shuffle=True, collate_fn=fn, **kw)
    with pytest.raises(RuntimeError, match=r"batch_sampler=ds.batch_sampler\(B\)"):
        next(iter(loader))
    with pytest.raises(RuntimeError, match="a state saved at batch 2 of epoch 0 was loaded"):
        new[0]
    # Another epoch, or the epoch restarted, is served by any loader.
    new.set_epoch(1)
    assert len(list(loader)) == len(loader)
    new.load_state_dict(dict(state, batch=0))
    assert len(list(loader)) == len(loader)


def test_mid_epoch_refusal_reaches_spawned_workers(volumes):
    """Spawned workers get the dataset pickled: the pending position travels with it (shared memory)."""
    ds = SliceDataset(volumes, **SLICE_BASE)
    ds.batch_sampler(2)
    state = ds.state_dict(batch=1)
    new = SliceDataset(volumes, **SLICE_BASE)
    new.load_state_dict(state)
    loader = DataLoader(new, batch_size=2, shuffle=True, collate_fn=slice_collate, num_workers=2,
                        multiprocessing_context="spawn")
    with pytest.raises(RuntimeError, match="a state saved at batch 1 of epoch 0 was loaded"):
        next(iter(loader))
    # The exact form in spawned workers: the batch sampler takes the position, the workers serve it.
    new.load_state_dict(state)
    exact = DataLoader(new, batch_sampler=new.batch_sampler(2), collate_fn=slice_collate, num_workers=2,
                       multiprocessing_context="spawn")
    ref = SliceDataset(volumes, **SLICE_BASE)
    want = [arrays(b) for b in DataLoader(ref, batch_sampler=ref.batch_sampler(2), collate_fn=slice_collate)][1:]
    assert same([arrays(b) for b in exact], want)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["patch", "slice"])
def test_the_exact_form_resumes_exactly(frames, volumes, kind, workers):
    def make():
        if kind == "patch":
            ds, fn = PatchDataset(frames, **PATCH_BASE), collate
        else:
            ds, fn = SliceDataset(volumes, **SLICE_BASE), slice_collate
        kw = dict(num_workers=workers, multiprocessing_context="fork") if workers else {}
        return ds, DataLoader(ds, batch_sampler=ds.batch_sampler(2), collate_fn=fn, **kw)

    ds, loader = make()
    run = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        run += [arrays(b) for b in loader]
    ds, loader = make()
    ds.set_epoch(0)
    it = iter(loader)
    before = [arrays(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(ds.state_dict(batch=2)))
    del it
    new, loader = make()
    new.load_state_dict(state)
    after = []
    for epoch in (0, 1):
        new.set_epoch(epoch)
        after += [arrays(b) for b in loader]
    assert len(run) > 4
    assert same(before + after, run)
