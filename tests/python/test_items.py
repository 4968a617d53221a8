"""SliceDataset[i] (the per-item path) gives exactly the items of the batched path, for every option."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import patchstore
from patchstore._volumes import draw_transforms
from patchstore.torch import SliceDataset, _slice_transform_row


@pytest.fixture(scope="module")
def vols(tmp_path_factory) -> str:
    """Two square volumes (16x16, 5 and 3 slices) and values outside [-1, 1] for the clamp."""
    base = tmp_path_factory.mktemp("items")
    rng = np.random.default_rng(3)
    src = base / "v.h5"
    with h5py.File(src, "w") as f:
        for g in ("MR", "CT", "MASK"):
            for name, s in (("a", 5), ("b", 3)):
                f.create_dataset(f"{g}/{name}", data=(rng.standard_normal((16, 16, s)) * 2).astype(np.float32))
    store = str(base / "v.ps")
    patchstore.ingest_hdf5(src, store, durable=False, progress=False)
    return store


def test_transform_rows_equal_the_vectorised_draw():
    rng = np.random.default_rng(0)
    for crop, flip, rot90 in ((None, True, True), ((5, 7), "independent", False), ((9, 9), False, True)):
        for seed in (0, 1, 2 ** 64 - 1, int(rng.integers(0, 2 ** 63))):
            for epoch in (0, 3, 2 ** 40):
                idx = rng.integers(0, 2 ** 40, 64)
                hs, ws = rng.integers(9, 300, 64), rng.integers(9, 300, 64)
                want = draw_transforms(seed, epoch, idx, hs, ws, crop, flip, rot90)
                got = [_slice_transform_row(seed, epoch, int(i), int(h), int(w), crop, flip, rot90)
                       for i, h, w in zip(idx, hs, ws)]
                np.testing.assert_array_equal(np.array(got, dtype=np.int64), want)


@pytest.mark.parametrize("opts", [
    {},
    {"context": 1},
    {"crop": 8, "flip": True, "rot90": True, "clamp": {"MR": (-1, 1)}},
    {"crop": (6, 10), "flip": "independent", "context": 2, "seed": 9},
    {"flip": True, "rot90": True, "clamp": (-0.5, 0.5)},
])
def test_item_equals_the_batched_item(vols, opts):
    ds = SliceDataset(vols, ("MR", "CT", "MASK"), **opts)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        n = len(ds)
        batched = ds.__getitems__(list(range(n)))
        for i in list(range(n)) + [-1, -n]:
            item = ds[i]
            assert isinstance(item, tuple) and len(item) == 3
            for a, b in zip(item, batched[i % n]):
                assert a.dtype == torch.float32 and a.is_contiguous() and a.shape == b.shape
                assert torch.equal(a, b), (opts, epoch, i)
    for bad in (len(ds), -len(ds) - 1):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
    with pytest.raises(TypeError):
        ds[1.5]


def test_items_are_independent_copies(vols):
    ds = SliceDataset(vols, ("MR", "CT"))
    a, b = ds[0]
    a.fill_(7)  # writable, and writing one item changes neither the store nor the next read
    assert not torch.equal(ds[0][0], a) and torch.equal(ds[0][1], b)


def test_items_in_a_worker_equal_items_in_process(vols):
    # batch_size=None: the DataLoader calls __getitem__ per item, here inside a (forked) worker.
    from torch.utils.data import DataLoader

    ds = SliceDataset(vols, ("MR", "CT"), crop=8, flip=True, seed=2)
    ds.set_epoch(4)
    got = list(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork"))
    assert len(got) == len(ds)
    for i, item in enumerate(got):
        for a, b in zip(item, ds[i]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("opts", [
    {"patch_size": 16},
    {"patch_size": 16, "patches_per_sample": 3, "require": "mask", "flip": True, "rot90": True, "seed": 5},
    {"patch_size": 8, "require": "mask", "min_valid": 0.1},
])
def test_patch_item_equals_the_batched_item(frameset, opts):
    import warnings

    from patchstore.torch import PatchDataset

    ds = PatchDataset(frameset.store, ["rgb", "mask", "depth"], **opts)
    n = len(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the empty-mask sample is skipped (and borrowed)
        for epoch in (0, 2):
            ds.set_epoch(epoch)
            batched = ds.__getitems__(list(range(n)))
            for i in list(range(n)) + [-1]:
                item = ds[i]
                assert sorted(item) == ["depth", "mask", "rgb"]
                for f in item:
                    a, b = item[f], batched[i % n][f]
                    assert a.shape == b.shape and a.dtype == torch.float32 and torch.equal(a, b), (opts, i, f)
    with pytest.raises(IndexError):
        ds[n]
