"""Batch prefetch (prefetch=) and the locality-aware order (order="locality", cache_budget=).

Prefetch only asks the OS to read ahead: every batch must be bit-identical with it on or off.
The locality order changes the epoch order only: each eligible sample once per epoch across ranks,
deterministic in (seed, epoch, rank, world_size), recorded in resume states.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import patchstore
from patchstore import _patchstore as _C
from patchstore.torch import BatchLoader, PatchDataset, SliceDataset

from conftest import TEMPLATES

FIELDS = ["rgb", "mask", "depth"]
pytestmark = pytest.mark.filterwarnings("ignore:patchstore.*skipping:RuntimeWarning")


def sampler(path, **kw):
    args = dict(patch_size=12, patches_per_sample=3, require="mask", seed=4, flip=True, rot90=True)
    args.update(kw)
    return patchstore.PatchSampler(path, FIELDS, **args)


@pytest.mark.parametrize("order", ["random", "locality"])
def test_batches_are_identical_with_and_without_prefetch(frameset, order):
    budget = "40KiB" if order == "locality" else None
    on = sampler(frameset.store, order=order, cache_budget=budget)
    off = sampler(frameset.store, order=order, cache_budget=budget, prefetch=False)
    two = sampler(frameset.store, order=order, cache_budget=budget, prefetch=2)
    assert on.options["prefetch"] == _C.DEFAULT_PREFETCH_BATCHES == 4
    assert off.options["prefetch"] == 0 and two.options["prefetch"] == 2
    for _ in range(25):  # 57 windows per epoch: batches of 7 straddle epochs
        a, wa = on.batch(7, return_windows=True)
        b, wb = off.batch(7, return_windows=True)
        c, wc = two.batch(7, return_windows=True)
        assert np.array_equal(wa.array, wb.array) and np.array_equal(wc.array, wb.array)
        for f in FIELDS:
            assert np.array_equal(a[f], b[f]) and np.array_equal(c[f], b[f])
    assert (on.epoch, on.cursor) == (off.epoch, off.cursor) == (two.epoch, two.cursor)


@pytest.mark.parametrize("bad,error", [(-1, ValueError), (65, ValueError), (1.5, TypeError), ("4", TypeError)])
def test_prefetch_must_be_a_bool_or_a_number_of_batches(frameset, bad, error):
    with pytest.raises(error, match="prefetch"):
        sampler(frameset.store, prefetch=bad)


def test_batchloader_prefetch_on_and_off_and_in_workers(frameset):
    kw = dict(batch_size=5, patches_per_sample=2, require="mask", seed=3, buffers=3)
    on = BatchLoader(frameset.store, FIELDS, 12, **kw)
    off = BatchLoader(frameset.store, FIELDS, 12, prefetch=False, **kw)
    for a, b in zip(on.batches(1), off.batches(1)):
        for f in FIELDS:
            assert torch.equal(a[f], b[f])
    got = [x["rgb"].clone() for x in torch.utils.data.DataLoader(on, batch_size=None, num_workers=2)]
    want = [x["rgb"].clone() for x in off.batches(0)]
    assert len(got) == len(want) == len(on)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_patchdataset_getitems_equals_getitem(frameset):
    ds = PatchDataset(frameset.store, FIELDS, 12, patches_per_sample=2, require="mask", seed=9)
    idx = [7, 0, 18, 3, 3]
    items = ds.__getitems__(idx)
    assert len(items) == len(idx)
    for item, i in zip(items, idx):
        single = ds[i]
        for f in FIELDS:
            assert torch.equal(item[f], single[f])


def test_locality_order_visits_each_sample_once_across_ranks(frameset):
    s0 = sampler(frameset.store)
    eligible = set(np.flatnonzero(s0.eligibility()).tolist())
    assert len(eligible) == 19  # one empty mask
    for world in (1, 2, 3):
        for epoch in (0, 1):
            visits = []
            for rank in range(world):
                s = sampler(frameset.store, order="locality", cache_budget=60_000, rank=rank, world_size=world)
                visits += [s.window(epoch, p).index for p in range(s.visits_per_epoch)]
            assert set(visits) == eligible
            assert len(visits) == -(-19 // world) * world  # padded as DistributedSampler, nothing else repeated
    a = sampler(frameset.store, order="locality", cache_budget="60KB")
    b = sampler(frameset.store, order="locality", cache_budget=60_000)
    e0 = [a.window(0, p).index for p in range(19)]
    assert e0 == [b.window(0, p).index for p in range(19)]
    assert e0 != [a.window(1, p).index for p in range(19)]
    assert e0 != [s0.window(0, p).index for p in range(19)]
    # The mask rule is unchanged: every served window still holds a valid mask pixel.
    out = a.batch(19 * 3)
    assert (out["mask"].reshape(57, -1).max(axis=1) > 0).all()


def test_locality_options_are_checked(frameset):
    with pytest.raises(ValueError, match="cache_budget"):
        sampler(frameset.store, order="locality")
    with pytest.raises(ValueError, match="order must be"):
        sampler(frameset.store, order="sorted")
    with pytest.raises(ValueError, match="not a byte size"):
        sampler(frameset.store, order="locality", cache_budget="lots")
    with pytest.raises(ValueError, match="positive"):
        sampler(frameset.store, order="locality", cache_budget=-5)
    assert _C.parse_byte_size("8GiB") == 8 << 30 and _C.parse_byte_size("8GB") == 8 * 10 ** 9
    s = sampler(frameset.store, order="locality", cache_budget="1MiB")
    assert s.options["order"] == "locality" and s.options["cache_budget"] == 1 << 20
    with pytest.raises(ValueError, match="locality"):
        patchstore.Store(frameset.store).montage(4, field="rgb", loader=s)


def test_epoch_batch_sampler_locality_order_and_resume(frameset):
    ds = PatchDataset(frameset.store, FIELDS, 12, require="mask", seed=5)
    n = len(ds)
    orders = {}
    for world in (1, 2, 4):
        seen = []
        for rank in range(world):
            bs = ds.batch_sampler(3, rank=rank, world_size=world, order="locality", cache_budget=40_000)
            seen += bs.order(2).tolist()
            orders[(world, rank)] = bs.order(2).tolist()
        assert sorted(set(seen)) == list(range(n))
        assert len(seen) == -(-n // world) * world
    other = PatchDataset(frameset.store, FIELDS, 12, require="mask", seed=5)
    random_order = other.batch_sampler(3).order(2).tolist()
    with pytest.raises(ValueError, match="shuffle=True"):
        ds.batch_sampler(3, shuffle=False, order="locality", cache_budget=40_000)
    # state_dict() records the order of the last batch_sampler() made (the one the loop uses).
    bs = ds.batch_sampler(3, order="locality", cache_budget=40_000)
    assert bs.order(2).tolist() == orders[(1, 0)]
    assert bs.order(2).tolist() != bs.order(3).tolist()
    assert bs.order(2).tolist() != random_order
    # The state records the order; a batch sampler of another order refuses to continue it.
    ds.set_epoch(2)
    state = ds.state_dict(batch=2)
    assert (state["batch_sampler"]["order"], state["batch_sampler"]["cache_budget"]) == ("locality", 40_000)
    fresh = PatchDataset(frameset.store, FIELDS, 12, require="mask", seed=5)
    fresh.load_state_dict(state)
    resumed = list(fresh.batch_sampler(3, order="locality", cache_budget=40_000))
    assert resumed == list(bs.batches(2, 2))
    fresh.load_state_dict(state)
    with pytest.raises(ValueError, match="order='locality'"):
        list(fresh.batch_sampler(3))
    # A state saved before order existed (version 2, no order keys) is a random-order state.
    old = {"type": "PatchDataset", "version": 2, "seed": 5, "length": len(fresh), "epoch": 2, "batch": 2}
    fresh.load_state_dict(old)
    assert list(fresh.batch_sampler(3)) == list(other.batch_sampler(3).batches(2, 2))


def test_batchloader_state_records_the_order(frameset):
    kw = dict(batch_size=4, require="mask", seed=1)
    loc = BatchLoader(frameset.store, FIELDS, 12, order="locality", cache_budget="50KB", **kw)
    state = loc.state_dict(epoch=1, batch=2)
    assert (state["options"]["order"], state["options"]["cache_budget"]) == ("locality", 50_000)
    with pytest.raises(ValueError, match="order"):
        BatchLoader(frameset.store, FIELDS, 12, **kw).load_state_dict(state)
    again = BatchLoader(frameset.store, FIELDS, 12, order="locality", cache_budget=50_000, **kw)
    again.load_state_dict(state)
    got = [b["rgb"].clone() for b in again]
    want = [b["rgb"].clone() for b in loc.batches(1)][2:]
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    rnd = BatchLoader(frameset.store, FIELDS, 12, **kw)
    old = {"type": "BatchLoader", "version": 2, "seed": 1, "world_size": 1, "batch_size": 4, "batches": len(rnd),
           "epoch": 0, "batch": 1}
    rnd.load_state_dict(old)  # states saved before order existed (version 2): order='random'
    with pytest.raises(ValueError, match="order='random', this BatchLoader has order='locality'"):
        again.load_state_dict(old)


def test_slice_dataset_locality_order(tmp_path):
    import h5py

    rng = np.random.default_rng(0)
    src = tmp_path / "v.h5"
    with h5py.File(src, "w") as f:
        g = f.create_group("MR")
        for name, depth in (("p1", 5), ("p2", 9), ("p3", 7)):
            g.create_dataset(name, data=rng.integers(0, 100, (depth, 8, 8)).astype(np.int16))
    store = tmp_path / "v.ps"
    patchstore.ingest_hdf5(src, store, groups=["MR"], slice_axis=0, durable=False)
    ds = SliceDataset(str(store), ["MR"], seed=2)
    items, nbytes = ds._locality_items()
    assert items.tolist() == list(range(21)) and (nbytes == 8 * 8 * 4).all()
    bs = ds.batch_sampler(4, order="locality", cache_budget=8 * 8 * 4 * 10)  # blocks of <= 5 slices
    order = bs.order(0).tolist()
    assert sorted(order) == list(range(21))
    # Blocks of at most 5 consecutive slices (about 5 blocks): neighbours in the order are near in storage.
    near = sum(abs(a - b) < 5 for a, b in zip(order, order[1:]))
    assert near >= 14, order
    a = ds.__getitems__(order[:4])
    for item, i in zip(a, order[:4]):
        assert all(torch.equal(x, y) for x, y in zip(item, ds[i]))


@pytest.mark.parametrize("layout", ["rows", "tiles"])
def test_read_patches_requests_every_window_before_copying(frameset, tmp_path, layout):
    """Store.read_patches (explicit ids and positions) goes through the reader's window read-ahead, as the
    sampler's gather does: each window's bytes requested (counted) before any is copied, values unchanged."""
    from patchstore._store import reader_of

    if layout == "rows":
        store = patchstore.open(frameset.store)
    else:
        path = tmp_path / "tiles.ps"
        patchstore.ingest_images(path, root=str(frameset.root), fields=TEMPLATES, durable=False,
                                 layout="tiles", tile_size=16, encoding="compact")
        store = patchstore.open(path)
    r = reader_of(store)
    rng = np.random.default_rng(23)
    n, h, w = 37, 13, 19
    keys = rng.integers(0, len(store), n)
    full = {int(k): np.asarray(store[int(k)]["rgb"]) for k in set(keys.tolist())}
    ys = np.array([rng.integers(0, full[int(k)].shape[1] - h + 1) for k in keys])
    xs = np.array([rng.integers(0, full[int(k)].shape[2] - w + 1) for k in keys])
    before = r.windows_read_ahead()
    got = store.read_patches(keys, "rgb", ys, xs, h, w, num_threads=2)
    assert r.windows_read_ahead() - before == n
    want = np.stack([full[int(k)][:, y:y + h, x:x + w] for k, y, x in zip(keys, ys, xs)])
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    # One window through Store.patch: requested too, same values.
    p = np.asarray(store.patch(int(keys[0]), "rgb", int(ys[0]), int(xs[0]), h, w))
    assert r.windows_read_ahead() - before == n + 1
    assert p.tobytes() == want[0].tobytes()
