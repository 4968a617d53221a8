"""Golden windows and states: the exact windows, slices and state_dict()s the Python loaders give for
fixed stores, seeds and epochs, pinned as literals.

IF A TEST HERE FAILS, THE SERVED DATA (OR THE SAVED-STATE FORMAT) CHANGED: every user's windows for a
given seed differ, and saved loader states resume onto other windows than the ones they were saved with
(or are refused). Update the literals only for a deliberate change, and note it in CHANGELOG.md.

The stores are ingested from PNG and HDF5 files whose pixels are integer formulas (no random
generator), so the literals depend only on the sampling code; rows and tiles layouts must give the same.
tests/reader/golden_windows_test.cc pins the same draws in C++.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import h5py
import numpy as np
import pytest

import patchstore
from patchstore.torch import BatchLoader, PatchDataset, SliceDataset

from conftest import write_png

H, W = 24, 32
IDS = [f"v/{i:04}" for i in range(6)]

# Store identities (Reader.identity(): ids, shapes, mask counts) of frame_store (rows and tiles alike:
# a re-laid-out store serves the same values) and of volume_store.
STORE_ID = "36cd9fed7a4e108f"
VOLUME_STORE_ID = "11cef8f0119ede72"
MASKED_STORE_ID = "2f2b65be468322a7"  # masked_volume_store

# Frame v/0002 has no mask pixel: the mask-aware loaders skip it, with a warning.
pytestmark = pytest.mark.filterwarnings("ignore:.*skipping 1 of:RuntimeWarning")


def frame(i: int):
    """(rgb (H, W, 3) uint8, mask (H, W) uint8 0/255) of frame i: formulas; frame 2's mask is empty."""
    y, x = np.mgrid[0:H, 0:W]
    rgb = np.stack([(y * 7 + x * 3 + i * 11 + c * 50) % 256 for c in range(3)], axis=-1).astype(np.uint8)
    mask = ((y * 3 + x * 5 + i * 7) % 13 < (i % 3) + 1) & (i != 2)
    return rgb, (mask * 255).astype(np.uint8)


def frame_store(base: Path, layout: str) -> str:
    """The 6 frames ingested into a store of `layout` ("rows", or "tiles" of 8 pixels)."""
    for i, fid in enumerate(IDS):
        rgb, mask = frame(i)
        write_png(base / "data" / f"{fid}.rgb.png", rgb)
        write_png(base / "data" / f"{fid}.mask.png", mask)
    store = str(base / f"{layout}.ps")
    patchstore.ingest_images(store, root=str(base / "data"),
                             fields={"rgb": "{video}/{frame}.rgb.png", "mask": "{video}/{frame}.mask.png"},
                             masks=["mask"], durable=False, progress=False, layout=layout,
                             tile_size=8 if layout == "tiles" else None)
    return store


def volume_store(base: Path) -> str:
    """Volumes p0 (5 slices), p1 (3), p2 (4) of 10 x 12, MR and CT from formulas (CT = MR + 10000)."""
    src = base / "v.h5"
    with h5py.File(src, "w") as f:
        for g, (name, depth) in ((g, v) for g in ("MR", "CT") for v in (("p0", 5), ("p1", 3), ("p2", 4))):
            y, x, s = np.mgrid[0:10, 0:12, 0:depth]
            data = y * 100 + x * 3 + s * 1000 + (g == "CT") * 10000
            f.require_group(g).create_dataset(name, data=data.astype(np.int16))
    store = str(base / "v.ps")
    patchstore.ingest_hdf5(src, store, groups=("MR", "CT"), durable=False, progress=False)
    return store


@pytest.fixture(scope="module", params=["rows", "tiles"])
def frames(request, tmp_path_factory) -> str:
    return frame_store(tmp_path_factory.mktemp("golden_frames"), request.param)


@pytest.fixture(scope="module")
def volumes(tmp_path_factory) -> str:
    return volume_store(tmp_path_factory.mktemp("golden_volumes"))


def rows(windows) -> List[str]:
    """'id y,x' per window, ' f<flip>r<rot>' when transformed, ' -' when drawn from the non-qualifying set."""
    out = []
    for w in windows:
        s = f"{w.id} {w.y},{w.x}"
        if w.flip or w.rot:
            s += f" f{w.flip}r{w.rot}"
        if not w.positive:
            s += " -"
        out.append(s)
    return out


# Served windows changed? That invalidates users' saved states: update only deliberately, with a
# CHANGELOG.md note.
def test_sampler_windows_two_epochs(frames):
    s = patchstore.PatchSampler(frames, ["rgb", "mask"], 8, patches_per_sample=2, require="mask", seed=7)
    assert s.skipped_ids == ["v/0002"]
    assert rows(s.windows(0)) == ["v/0001 16,1", "v/0001 2,0", "v/0003 8,2", "v/0003 15,21", "v/0004 7,16",
                                  "v/0004 8,2", "v/0000 0,14", "v/0000 10,12", "v/0005 5,15", "v/0005 16,1"]
    assert rows(s.windows(1)) == ["v/0000 12,17", "v/0000 12,9", "v/0003 4,20", "v/0003 13,7", "v/0004 0,19",
                                  "v/0004 12,8", "v/0005 15,23", "v/0005 1,6", "v/0001 5,15", "v/0001 4,24"]


# Served windows changed? That invalidates users' saved states: update only deliberately, with a
# CHANGELOG.md note.
def test_sampler_flips_turns_rank_and_subset(frames):
    s = patchstore.PatchSampler(frames, ["rgb"], 6, patches_per_sample=3, positive_fraction=0.5, require="mask",
                                seed=3, rank=1, world_size=2, flip=True, rot90=True,
                                ids=["v/0005", "v/0001", "v/0003", "v/0002"])
    assert rows(s.windows(0)) == ["v/0002 8,4 f0r1 -", "v/0002 18,23 f3r1 -", "v/0002 11,26 f1r0 -",
                                  "v/0005 6,26 f0r1", "v/0005 6,13", "v/0005 13,12 f1r2"]


# Served windows or the state format changed? That invalidates users' saved states: update only
# deliberately, with a CHANGELOG.md note.
def test_batch_loader_batches_and_state(frames):
    loader = BatchLoader(frames, ["rgb", "mask"], (6, 8), batch_size=2, patches_per_sample=1, require="mask",
                         min_valid=2, seed=5)
    it = iter(loader)
    first = next(it)
    next(it)
    assert loader.state_dict() == {
        "type": "BatchLoader", "version": 3,
        "options": {"batch_size": 2, "cache_budget": None, "drop_last": False, "fields": ["rgb", "mask"],
                    "flip": False, "ids": None, "min_valid": 2.0, "order": "random", "patch_size": [6, 8],
                    "patches_per_sample": 1, "policy": "auto", "positive_fraction": None, "require": "mask",
                    "rot90": False, "seed": 5, "world_size": 1},
        "store": STORE_ID, "batches": 3, "epoch": 0, "batch": 2}
    # Pixel (0, 0) of red names the source pixel ((y * 7 + x * 3 + i * 11) % 256 of frame i).
    red = np.rint((first["rgb"][:, 0, 0, 0].numpy() + 1) / 2 * 255).astype(int).tolist()
    assert red == [152, 129]
    loc = BatchLoader(frames, "rgb", 4, batch_size=2, seed=1, order="locality", cache_budget=1 << 20)
    assert loc.state_dict(epoch=1, batch=1) == {
        "type": "BatchLoader", "version": 3,
        "options": {"batch_size": 2, "cache_budget": 1048576, "drop_last": False, "fields": ["rgb"],
                    "flip": False, "ids": None, "min_valid": 1.0, "order": "locality", "patch_size": 4,
                    "patches_per_sample": 1, "policy": "auto", "positive_fraction": None, "require": None,
                    "rot90": False, "seed": 1, "world_size": 1},
        "store": STORE_ID, "batches": 3, "epoch": 1, "batch": 1}
    assert rows(loc.sampler.windows(0)) == ["v/0001 14,21", "v/0002 5,26", "v/0000 2,17", "v/0004 0,25",
                                            "v/0003 19,3", "v/0005 2,13"]


# Served windows or the state format changed? That invalidates users' saved states: update only
# deliberately, with a CHANGELOG.md note.
def test_patch_dataset_items_and_state(frames):
    ds = PatchDataset(frames, ["rgb", "mask"], 8, patches_per_sample=2, require="mask", seed=4)
    ds.set_epoch(1)
    # Item i's windows: rows (sample, y, x, flip, rot, positive).
    items = [ds.windows(i).tolist() for i in range(len(ds))]
    assert items == [[[0, 4, 2, 0, 0, 1], [0, 9, 22, 0, 0, 1]], [[1, 5, 9, 0, 0, 1], [1, 0, 7, 0, 0, 1]],
                     [[3, 5, 16, 0, 0, 1], [3, 11, 24, 0, 0, 1]], [[4, 5, 13, 0, 0, 1], [4, 14, 13, 0, 0, 1]],
                     [[5, 12, 17, 0, 0, 1], [5, 12, 2, 0, 0, 1]]]
    assert list(ds.batch_sampler(2)) == [[3, 2], [4, 0], [1]]
    options = {"fields": ["rgb", "mask"], "flip": False, "ids": None, "min_valid": 1.0, "patch_size": 8,
               "patches_per_sample": 2, "policy": "auto", "positive_fraction": None, "require": "mask",
               "rot90": False, "seed": 4}
    assert ds.state_dict(batch=1) == {
        "type": "PatchDataset", "version": 3, "options": options, "store": STORE_ID, "length": 5,
        "batch_sampler": {"batch_size": 2, "shuffle": True, "drop_last": False, "world_size": 1,
                          "order": "random", "cache_budget": None},
        "epoch": 1, "batch": 1}
    assert list(ds.batch_sampler(2, order="locality", cache_budget=1 << 16)) == [[1, 2], [3, 4], [0]]
    assert ds.state_dict(batch=2) == {
        "type": "PatchDataset", "version": 3, "options": options, "store": STORE_ID, "length": 5,
        "batch_sampler": {"batch_size": 2, "shuffle": True, "drop_last": False, "world_size": 1,
                          "order": "locality", "cache_budget": 65536},
        "epoch": 1, "batch": 2}


# Served slices or the state format changed? That invalidates users' saved states: update only
# deliberately, with a CHANGELOG.md note.
def test_slice_dataset_items_and_state(volumes):
    ds = SliceDataset(volumes, ("MR", "CT"), context=1, crop=7, flip="independent", rot90=True, seed=13)
    items = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            t = ds.transform(i)
            items.append(f"{ds.ref(i).id} {ds.ref(i).slice}: {t.y},{t.x} {int(t.flip_v)}{int(t.flip_h)}{t.rot90}")
    # "id slice: y,x" of the crop, then flip_v, flip_h and quarter turns; epoch 0, then epoch 1.
    assert items == ["p0 0: 1,5 110", "p0 1: 2,0 110", "p0 2: 0,0 100", "p0 3: 3,2 113", "p0 4: 2,0 001",
                     "p1 0: 3,2 011", "p1 1: 2,2 010", "p1 2: 0,3 000", "p2 0: 3,1 112", "p2 1: 3,1 012",
                     "p2 2: 3,5 100", "p2 3: 3,2 112",
                     "p0 0: 1,3 112", "p0 1: 3,5 112", "p0 2: 2,1 103", "p0 3: 3,4 002", "p0 4: 0,4 102",
                     "p1 0: 3,5 002", "p1 1: 0,0 013", "p1 2: 1,1 110", "p2 0: 2,5 102", "p2 1: 3,5 010",
                     "p2 2: 3,0 003", "p2 3: 1,5 112"]
    # Item 4 of epoch 1 (p0's last slice, context 1: slices 3, 4, 4): pixel (0, 0) of each slice names
    # its source (s * 1000 + y * 100 + x * 3, CT + 10000).
    mr, ct = ds[4]
    assert mr[:, 0, 0].tolist() == [3030.0, 4030.0, 4030.0]
    assert ct[:, 0, 0].tolist() == [13030.0, 14030.0, 14030.0]
    assert list(ds.batch_sampler(4, rank=1, world_size=2)) == [[2, 5, 4, 8], [1, 10]]
    assert ds.state_dict(batch=3) == {
        "type": "SliceDataset", "version": 3,
        "options": {"clamp": {}, "context": 1, "crop": [7, 7], "fields": ["MR", "CT"], "flip": "independent",
                    "ids": ["p0", "p1", "p2"], "rot90": True, "seed": 13},
        "store": VOLUME_STORE_ID, "length": 12,
        "batch_sampler": {"batch_size": 4, "shuffle": True, "drop_last": False, "world_size": 2,
                          "order": "random", "cache_budget": None},
        "epoch": 1, "batch": 3}


def masked_volume_store(base: Path) -> str:
    """Volumes p0 (5 slices), p1 (3), p2 (4) of 10 x 12: MR and CT as volume_store's, and a MASK from a formula
    (slices with k % 3 == 2 empty, the others a band that widens with the slice)."""
    src = base / "m.h5"
    with h5py.File(src, "w") as f:
        for s, (name, depth) in enumerate((("p0", 5), ("p1", 3), ("p2", 4))):
            y, x, k = np.mgrid[0:10, 0:12, 0:depth]
            for g in ("MR", "CT"):
                f.require_group(g).create_dataset(name, data=(y * 100 + x * 3 + k * 1000 + (g == "CT") * 10000)
                                                  .astype(np.int16))
            mask = ((y * 3 + x * 5 + s * 7) % 13 < k + 2 + s) & (k % 3 != 2)
            f.require_group("MASK").create_dataset(name, data=mask.astype(np.uint8))
    store = str(base / "m.ps")
    patchstore.ingest_hdf5(src, store, groups=("MR", "CT", "MASK"), masks=["MASK"], durable=False, progress=False)
    return store


# Served mask-aware slices changed? That invalidates users' saved states: update only deliberately, with a
# CHANGELOG.md note. (The C++ golden test GoldenSlices.MaskAwareItems pins the engine on the same formula.)
def test_slice_dataset_mask_aware_items_and_state(tmp_path_factory):
    store = masked_volume_store(tmp_path_factory.mktemp("golden_masked"))
    ds = SliceDataset(store, ("MR", "CT"), context={"MR": 1}, crop=6, flip="independent", seed=17, require="MASK",
                      min_valid=12)

    def items(d: SliceDataset, epoch: int) -> List[str]:
        out = []
        for i in range(len(d)):
            (sid, k), t = d.served(i, epoch)
            out.append(f"{sid} {k}: {t.y},{t.x} {int(t.flip_v)}{int(t.flip_h)}{t.rot90}"
                       + ("" if d.positive(i, epoch) else " -"))
        return out

    # "id slice: y,x" of the crop, then flip_v, flip_h and quarter turns: the qualifying slices only.
    assert items(ds, 0) == ["p0 3: 3,3 100", "p0 4: 2,6 010", "p1 1: 2,0 100", "p2 0: 0,5 110", "p2 1: 4,0 010",
                            "p2 3: 4,5 010"]
    assert items(ds, 1) == ["p0 3: 2,5 110", "p0 4: 4,5 010", "p1 1: 1,1 000", "p2 0: 4,0 010", "p2 1: 0,5 100",
                            "p2 3: 0,1 100"]
    # Item 0 of epoch 0: MR slices 2, 3, 4 of p0, the crop at (3, 3) upside down: its pixel (0, 0) is (8, 3).
    mr, ct = ds[0]
    assert (tuple(mr.shape), tuple(ct.shape)) == ((3, 6, 6), (1, 6, 6))
    assert mr[:, 0, 0].tolist() == [2809.0, 3809.0, 4809.0] and ct[:, 0, 0].tolist() == [13809.0]
    ds.batch_sampler(2)
    assert ds.state_dict(batch=1) == {
        "type": "SliceDataset", "version": 3,
        "options": {"clamp": {}, "context": {"CT": 0, "MR": 1}, "crop": [6, 6], "fields": ["MR", "CT"],
                    "flip": "independent", "ids": ["p0", "p1", "p2"], "min_valid": 12.0, "require": "MASK",
                    "rot90": False, "seed": 17},
        "store": MASKED_STORE_ID, "length": 6,
        "batch_sampler": {"batch_size": 2, "shuffle": True, "drop_last": False, "world_size": 1,
                          "order": "random", "cache_budget": None},
        "epoch": 0, "batch": 1}
    pf = SliceDataset(store, ("MR", "CT"), crop=6, flip="independent", seed=17, require="MASK", min_valid=12,
                      positive_fraction=0.5)
    # Every slice; " -": drawn from the windows that do not qualify (a slice lacking the kind drawn is replaced
    # by one of its volume that has it).
    assert items(pf, 0) == ["p0 0: 3,3 100 -", "p0 1: 2,6 010 -", "p0 4: 2,4 100", "p0 1: 3,0 110 -",
                            "p0 4: 4,0 010", "p1 0: 4,5 010 -", "p1 1: 1,6 110", "p1 1: 1,1 000", "p2 0: 1,2 100",
                            "p2 0: 1,0 010 -", "p2 2: 0,0 010 -", "p2 3: 3,5 000"]
