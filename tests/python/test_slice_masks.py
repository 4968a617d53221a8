"""What 2.5D MR->CT training needs from SliceDataset: per-field context and mask-aware slices and crops.

Mask-aware items are checked against an oracle written here in NumPy: every window of every mask slice
counted with a summed-area table (np.cumsum), on small volumes ingested from HDF5.
"""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import warnings

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import patchstore
from patchstore.torch import SliceDataset, slice_collate, to_float

IDS = ("p0", "p1", "p2", "empty")
DEPTH = {"p0": 7, "p1": 5, "p2": 6, "empty": 3}
H, W = 16, 18


def blob_mask(rng: np.random.Generator, depth: int) -> np.ndarray:
    """(S, H, W) uint8: a disc per slice, of varying radius, absent on some slices."""
    y, x = np.mgrid[0:H, 0:W]
    out = np.zeros((depth, H, W), np.uint8)
    for k in range(depth):
        if rng.random() < 0.3:
            continue
        cy, cx, r = rng.integers(2, H - 2), rng.integers(2, W - 2), rng.integers(1, 6)
        out[k] = ((y - cy) ** 2 + (x - cx) ** 2 <= r * r) * rng.integers(1, 3)
    return out


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    """(store path, {id: {field: array}}): MR and CT int16, MASK uint8 (discs; 'empty' has none), stored compact."""
    base = tmp_path_factory.mktemp("masked")
    rng = np.random.default_rng(11)
    vols = {}
    with h5py.File(base / "v.h5", "w") as f:
        for pid in IDS:
            d = DEPTH[pid]
            mr = rng.integers(-500, 2000, (d, H, W)).astype(np.int16)
            ct = rng.integers(-1024, 3000, (d, H, W)).astype(np.int16)
            mask = blob_mask(rng, d) if pid != "empty" else np.zeros((d, H, W), np.uint8)
            vols[pid] = {"MR": mr, "CT": ct, "MASK": mask}
            for g, a in vols[pid].items():
                f.create_dataset(f"{g}/{pid}", data=a, chunks=(1, H, W))
    store = str(base / "v.ps")
    with pytest.warns(RuntimeWarning, match="'empty'.* is all zero"):
        patchstore.ingest_hdf5(base / "v.h5", store, slice_axis=0, masks=["MASK"], encoding="compact",
                               durable=False, progress=False)
    return store, vols


def threshold(min_valid: float, area: int) -> int:
    return max(1, math.ceil(min_valid * area) if min_valid < 1 else math.ceil(min_valid))


def window_counts(mask: np.ndarray, h: int, w: int) -> np.ndarray:
    """Valid voxels of every h x w window of a 2D mask: (H-h+1, W-w+1)."""
    c = np.zeros((mask.shape[0] + 1, mask.shape[1] + 1), np.int64)
    c[1:, 1:] = (mask != 0).cumsum(0).cumsum(1)
    return c[h:, w:] - c[:-h, w:] - c[h:, :-w] + c[:-h, :-w]


def stack_ref(vol: np.ndarray, k: int, c: int) -> np.ndarray:
    return vol[np.clip(np.arange(k - c, k + c + 1), 0, vol.shape[0] - 1)]


def served_reference(vols, ds: SliceDataset, i: int, epoch: int):
    """Item i of `epoch` in NumPy from the served slice and transform: stacks per field, transformed, clamped."""
    (pid, k), t = ds.served(i, epoch)
    out = []
    for f in ds.fields:
        v = vols[pid][f]
        v = (v != 0).astype(np.float32) if f == "MASK" else v.astype(np.float32)  # masks: binary normalisation
        a = t.apply(stack_ref(v, k, ds.contexts[f]))
        if f in ds.clamp:
            a = np.clip(a, *ds.clamp[f])
        out.append(np.ascontiguousarray(a))
    return out


# -- 1. per-field context ---------------------------------------------------------------------------


def test_per_field_context_gives_each_field_its_stack(masked):
    store, vols = masked
    ds = SliceDataset(store, ("MR", "CT", "MASK"), context={"MR": 2}, crop=8, flip="independent", rot90=True, seed=3)
    assert ds.contexts == {"MR": 2, "CT": 0, "MASK": 0}  # a field not named gets 0
    assert ds.context == {"MR": 2, "CT": 0, "MASK": 0}
    assert SliceDataset(store, ("MR", "CT"), context={"MR": 1, "CT": 1}).context == 1  # one number when equal
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        batch = ds.__getitems__(list(range(len(ds))))
        for i in range(len(ds)):
            item = ds[i]
            assert [tuple(t.shape) for t in item] == [(5, 8, 8), (1, 8, 8), (1, 8, 8)]
            for got, got_b, want in zip(item, batch[i], served_reference(vols, ds, i, epoch)):
                np.testing.assert_array_equal(got.numpy(), want)
                assert torch.equal(got, got_b)
    mr, ct, mask = slice_collate(ds.__getitems__([0, 5, 9]))
    assert (mr.shape, ct.shape, mask.shape) == ((3, 5, 8, 8), (3, 1, 8, 8), (3, 1, 8, 8))
    # Stored-dtype items with their own depth; to_float gives the float32 items bit for bit.
    st = SliceDataset(store, ("MR", "CT"), context={"MR": 1}, crop=8, seed=3, output="stored")
    fl = SliceDataset(store, ("MR", "CT"), context={"MR": 1}, crop=8, seed=3)
    a, b = slice_collate(st.__getitems__([1, 2, 3]))
    assert (a.dtype, a.shape, b.shape) == (torch.int16, (3, 3, 8, 8), (3, 1, 8, 8))
    fa, fb = to_float((a, b), st)
    ra, rb = slice_collate(fl.__getitems__([1, 2, 3]))
    assert torch.equal(fa, ra) and torch.equal(fb, rb)
    assert [tuple(t.shape) for t in st[4]] == [(3, 8, 8), (1, 8, 8)]


def test_context_spellings_are_checked_in_cpp(masked):
    store, _ = masked
    with pytest.raises(ValueError, match=r"SliceDataset: context \(--context\) names field 'PET', which is not "
                                         r"among the fields served \(MR, CT\)"):
        SliceDataset(store, ("MR", "CT"), context={"PET": 1})
    with pytest.raises(ValueError, match=r"context \(--context\) must be in \[0, 65536\] slices for 'MR', got -1"):
        SliceDataset(store, ("MR", "CT"), context={"MR": -1})
    with pytest.raises(TypeError, match=r"context \(--context\) must be a number of slices or a dict"):
        SliceDataset(store, ("MR",), context="1")
    with pytest.raises(ValueError, match=r"crop \(--crop\) must be positive"):
        SliceDataset(store, ("MR",), crop=0)
    with pytest.raises(ValueError, match=r"positive_fraction needs require=<mask field>"):
        SliceDataset(store, ("MR",), positive_fraction=0.5)
    with pytest.raises(KeyError, match="SEG"):
        SliceDataset(store, ("MR",), require="SEG")
    cfg = patchstore.SliceConfig(context={"MR": 1}, crop=8)
    assert SliceDataset(store, ("MR", "CT"), config=cfg).contexts == {"MR": 1, "CT": 0}
    with pytest.raises(ValueError, match=r"crop=6 contradicts config.crop=8"):
        SliceDataset(store, ("MR", "CT"), config=cfg, crop=6)


# -- 2. mask-aware slices and crops: the NumPy oracle ---------------------------------------------------


@pytest.mark.parametrize("crop,min_valid", [(None, 1), (None, 20), (None, 0.1), (8, 1), (8, 12), ((6, 10), 0.25)])
def test_min_valid_serves_exactly_the_qualifying_slices_and_crops(masked, crop, min_valid):
    store, vols = masked
    with pytest.warns(RuntimeWarning, match=r"'empty' \(no .* with >= \d+ valid voxels of 'MASK'\)"):
        ds = SliceDataset(store, ("MR", "CT", "MASK"), context={"MR": 1}, crop=crop, flip=True, seed=9,
                          require="MASK", min_valid=min_valid)
    ch, cw = (H, W) if crop is None else ((crop, crop) if isinstance(crop, int) else crop)
    T = threshold(min_valid, ch * cw)
    want = [(pid, k) for pid in IDS for k in range(DEPTH[pid])
            if window_counts(vols[pid]["MASK"][k], ch, cw).max() >= T]
    assert [tuple(ds.ref(i)) for i in range(len(ds))] == want
    assert ds.skipped_ids == ["empty"]
    assert ds.skipped_slices == sum(DEPTH[p] for p in IDS if p != "empty") - len(want)
    for epoch in (0, 1, 2):
        for i in range(len(ds)):
            (pid, k), t = ds.served(i, epoch)
            assert (pid, k) == want[i]  # min_valid serves the item's own slice
            window = vols[pid]["MASK"][k][t.y:t.y + ch, t.x:t.x + cw]
            assert np.count_nonzero(window) >= T, (i, epoch, t)
            assert ds.positive(i, epoch)
        ds.set_epoch(epoch)
        items = ds.__getitems__(list(range(len(ds))))
        for i in range(0, len(ds), 3):
            for got, ref in zip(items[i], served_reference(vols, ds, i, epoch)):
                np.testing.assert_array_equal(got.numpy(), ref)


def test_positive_fraction_draws_each_kind_with_its_probability(masked):
    store, vols = masked
    ds = SliceDataset(store, ("MR", "MASK"), crop=8, seed=4, require="MASK", min_valid=10, positive_fraction=0.7)
    assert len(ds) == sum(DEPTH.values()) and ds.skipped == 0  # every slice is an item
    T = 10
    counts = {pid: [window_counts(vols[pid]["MASK"][k], 8, 8) for k in range(DEPTH[pid])] for pid in IDS}
    positive = total = 0
    for epoch in range(40):
        for i in range(len(ds)):
            own = ds.ref(i)
            (pid, k), t = ds.served(i, epoch)
            assert pid == own.id  # replacements stay in the item's volume
            c = counts[pid][k][t.y, t.x]
            is_pos = ds.positive(i, epoch)
            assert (c >= T) == is_pos, (i, epoch)
            # The item's own slice is served whenever it has a window of the kind drawn.
            own_c = counts[own.id][own.slice]
            if (own_c >= T).any() if is_pos else (own_c < T).any():
                assert k == own.slice
            if own.id == "empty":
                assert not is_pos  # no qualifying window in that volume: the other kind
            else:
                positive += is_pos
                total += 1
    assert 0.64 < positive / total < 0.76, positive / total


def test_mask_aware_items_are_the_same_in_workers_and_after_pickling(masked):
    store, _ = masked
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ds = SliceDataset(store, ("MR", "CT"), context={"MR": 1}, crop=8, rot90=True, seed=2, require="MASK",
                          min_valid=6, positive_fraction=None)
    again = pickle.loads(pickle.dumps(ds))
    assert again._flags == ds._flags and len(again) == len(ds)
    assert [again.served(i, 3) for i in range(len(ds))] == [ds.served(i, 3) for i in range(len(ds))]

    def run(num_workers):
        loader = DataLoader(ds, batch_sampler=ds.batch_sampler(4), num_workers=num_workers,
                            collate_fn=slice_collate, multiprocessing_context="fork" if num_workers else None)
        out = []
        for e in (0, 1):
            ds.set_epoch(e)
            out += [tuple(t.clone() for t in b) for b in loader]
        return out

    a, b = run(0), run(2)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert all(torch.equal(u, v) for u, v in zip(x, y))


def test_state_records_the_mask_options_and_checks_them(masked):
    store, _ = masked
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ds = SliceDataset(store, ("MR", "CT"), context={"MR": 1}, crop=8, seed=2, require="MASK", min_valid=6)
        other = SliceDataset(store, ("MR", "CT"), context={"MR": 1}, crop=8, seed=2, require="MASK", min_valid=7)
    ds.batch_sampler(4)
    state = ds.state_dict(batch=1)
    o = state["options"]
    assert (o["require"], o["min_valid"], o["context"]) == ("MASK", 6.0, {"CT": 0, "MR": 1})
    assert "positive_fraction" not in o  # off: not recorded (states of older versions have none)
    assert o["ids"] == ["p0", "p1", "p2"]  # the volumes served ('empty' has no qualifying slice)
    with pytest.warns(RuntimeWarning, match="'empty'"):
        fresh = SliceDataset(store, ("MR", "CT"), context={"MR": 1}, crop=8, seed=2, require="MASK", min_valid=6)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    with pytest.raises(ValueError, match=r"saved with min_valid=6.0, this SliceDataset has min_valid=7.0"):
        other.load_state_dict(state)
    plain = SliceDataset(store, ("MR", "CT"), context={"MR": 1}, crop=8, seed=2, ids=["p0", "p1", "p2"])
    assert "require" not in plain.state_dict()["options"]
    with pytest.raises(ValueError, match=r"saved with min_valid=6.0, this SliceDataset has min_valid=\(not recorded\)"):
        plain.load_state_dict(state)  # options are compared by name: min_valid comes before require
    with pytest.warns(RuntimeWarning, match="'empty'"):
        one = SliceDataset(store, ("MR", "CT"), context=1, crop=8, seed=2, require="MASK", min_valid=6)
    with pytest.raises(ValueError, match=r"saved with context=\{'CT': 0, 'MR': 1\}, this SliceDataset has context=1"):
        one.load_state_dict(state)


# -- 3. montage and bench take the same options ------------------------------------------------------


def test_montage_shows_the_mask_aware_items(masked, cli, tmp_path):
    store, _ = masked
    s = patchstore.open(store)
    kw = dict(context={"MR": 1}, crop=8, seed=5, require="MASK", min_valid=12)
    with pytest.warns(RuntimeWarning, match=r"1 of 4 volumes give no item .* 'empty' \(no 8x8 crop with >= 12"):
        sheet = s.montage(count=6, field="MASK", window=(0, 1), labels=False, tile=8, **kw)
    # Every tile is the centre slice of a served item's crop: it holds >= 12 mask voxels.
    tiles = [sheet[2 + r * 10:10 + r * 10, 2 + c * 10:10 + c * 10] for r in range(2) for c in range(3)]
    assert all(np.count_nonzero(t[..., 0]) >= 12 for t in tiles)
    if cli is not None:
        out = tmp_path / "m.png"
        r = subprocess.run([cli, "montage", store, str(out), "--field", "MASK", "--count", "6", "--window", "0,1",
                            "--tile", "8", "--context", "MR=1", "--crop", "8", "--seed", "5", "--require", "MASK",
                            "--min-valid", "12"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "patchstore: warning: 1 of 4 volumes give no item" in r.stderr
        from PIL import Image
        cli_sheet = np.asarray(Image.open(out).convert("RGB"))
        with pytest.warns(RuntimeWarning):
            py_sheet = s.montage(count=6, field="MASK", window=(0, 1), tile=8, **kw)
        np.testing.assert_array_equal(cli_sheet, py_sheet)
        r = subprocess.run([cli, "montage", store, str(out), "--context", "PET=1"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 1 and "context (--context) names field 'PET'" in r.stderr, r.stderr


def test_cli_bench_draws_the_mask_aware_items(masked, cli):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    store, _ = masked
    r = subprocess.run([cli, "bench", store, "--seconds", "0.1", "--processes", "1", "--batch", "4", "--field", "MR",
                        "--field", "CT", "--context", "MR=1", "--crop", "8", "--require", "MASK", "--min-valid",
                        "12", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    with pytest.warns(RuntimeWarning):
        ds = SliceDataset(store, ("MR", "CT"), crop=8, require="MASK", min_valid=12)
    assert (d["items"], d["require"], d["height"]) == (len(ds), "MASK", 8)
    assert [x["context"] for x in d["runs"]] == [0, {"MR": 1, "CT": 0}]
    assert all(x["items_per_s"] > 0 for x in d["runs"])
    r = subprocess.run([cli, "bench", store, "--seconds", "0.1", "--positive-fraction", "0.5"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "positive_fraction needs require=<mask field>" in r.stderr, r.stderr
