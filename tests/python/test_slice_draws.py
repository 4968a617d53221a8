"""SliceDataset's draws come from C++ (reader/transform.h's generator): checked against a reference written here."""

from __future__ import annotations

import subprocess

import h5py
import numpy as np
import pytest

import patchstore
from patchstore import _patchstore as _C
from patchstore._volumes import draw_transforms
from patchstore.torch import SliceDataset

M64 = (1 << 64) - 1


def mix(z: int) -> int:  # SplitMix64's output function, the reference
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference(seed, epoch, i, H, W, crop, flip, rot90):
    key = mix(seed)
    for part in (epoch, i, 0x534C4943):  # "SLIC"
        key = mix(key ^ part)
    row = [0] * 7
    if crop is not None:
        ch, cw = crop
        row[0] = ((mix(key ^ 1) >> 32) * (H - ch + 1)) >> 32
        row[1] = ((mix(key ^ 2) >> 32) * (W - cw + 1)) >> 32
        row[2], row[3] = ch, cw
    if flip:
        u = mix(key ^ 3)
        row[4] = u & 1
        row[5] = (u >> 1) & 1 if flip == "independent" else u & 1
    if rot90:
        v = mix(key ^ 4)
        row[6] = 1 + (((v >> 32) * 3) >> 32) if v & 1 else 0
    return row


@pytest.fixture(scope="module")
def vols(tmp_path_factory) -> str:
    """Volumes a (12x10, 4 slices) and b (12x10, 3 slices)."""
    base = tmp_path_factory.mktemp("draws")
    rng = np.random.default_rng(5)
    src = base / "v.h5"
    with h5py.File(src, "w") as f:
        for g in ("MR", "CT", "MASK"):  # ingest_hdf5's default groups
            for name, s in (("a", 4), ("b", 3)):
                f.create_dataset(f"{g}/{name}", data=rng.standard_normal((12, 10, s)).astype(np.float32))
    store = str(base / "v.ps")
    patchstore.ingest_hdf5(src, store, durable=False, progress=False)
    return store


@pytest.mark.parametrize("crop,flip,rot90", [(None, True, True), ((5, 7), "independent", False),
                                             ((9, 9), False, True), (None, False, False)])
def test_cpp_draws_equal_the_reference(crop, flip, rot90):
    mode = "independent" if flip == "independent" else ("both" if flip else "")
    ch, cw = crop if crop else (0, 0)
    for seed in (0, 7, M64):
        for epoch in (0, 5, 2 ** 40):
            idx = [0, 1, 2, 99, 2 ** 40 + 3]
            want = [reference(seed, epoch, i, 20, 30, crop, flip, rot90) for i in idx]
            got = [list(_C.draw_slice_transform(seed, epoch, i, 20, 30, ch, cw, mode, rot90)) for i in idx]
            assert got == want
            rows = draw_transforms(seed, epoch, np.array(idx), np.full(5, 20), np.full(5, 30), crop, flip, rot90)
            assert rows.tolist() == want


def test_draw_item_is_the_lookup_and_the_draw(vols):
    store = patchstore.Store(vols)
    ix = store.slice_index()
    r = patchstore._store.reader_of(store)
    native = _C.SliceSampler(r, _C.SliceOptions(fields=["MR"], seed=3, crop=(8, 6), flip="independent"))
    for i in range(len(ix)):
        sample, k, oh, ow, row, positive = native.draw_item(2, i)
        assert (sample, k) == tuple(ix._n().at(i)[:2]) and positive
        assert list(row) == reference(3, 2, i, 12, 10, (8, 6), "independent", False)
        assert (oh, ow) == (8, 6)
    # Turns need square planes (a batch has one shape): non-square slices without a crop are refused.
    with pytest.raises(ValueError, match=r"rot90 \(--rot90\) needs square slices or a square crop"):
        _C.SliceSampler(r, _C.SliceOptions(fields=["MR"], seed=1, rot90=True))
    with pytest.raises(IndexError):
        native.draw_item(0, len(ix))
    with pytest.raises(IndexError):
        native.draw_item(0, -1)
    with pytest.raises(ValueError, match="crop 13x6 is larger than the slices of every volume"):
        _C.SliceSampler(r, _C.SliceOptions(fields=["MR"], crop=(13, 6)))
    with pytest.raises(ValueError, match=r"flip \(--flip\) must be False, True or 'independent'"):
        _C.SliceOptions(fields=["MR"], flip="sideways")


def test_item_equals_the_reference_transform_applied_with_numpy(vols):
    ds = SliceDataset(vols, ("MR", "CT"), crop=(8, 6), flip="independent", seed=11)
    store = patchstore.Store(vols)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            ref = ds.ref(i)
            t = patchstore.SliceTransform.from_row(reference(11, epoch, i, 12, 10, (8, 6), "independent", False))
            assert ds.transform(i) == t
            for f, got in zip(("MR", "CT"), ds[i]):
                want = t.apply(store.slice(ref.id, f, ref.slice, 0))
                np.testing.assert_array_equal(got.numpy(), want)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> str:
    """Volumes big (20x18, 3 slices), small (12x10, 2 slices), tiny (6x6, 4 slices) (store order: by id)."""
    base = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(6)
    src = base / "v.h5"
    with h5py.File(src, "w") as f:
        for g in ("MR", "CT", "MASK"):
            for name, shape in (("small", (12, 10, 2)), ("big", (20, 18, 3)), ("tiny", (6, 6, 4))):
                f.create_dataset(f"{g}/{name}", data=rng.standard_normal(shape).astype(np.float32))
    store = str(base / "v.ps")
    patchstore.ingest_hdf5(src, store, durable=False, progress=False)
    return store


def test_volumes_smaller_than_the_crop_are_skipped_counted_and_warned_once(mixed):
    with pytest.warns(RuntimeWarning, match=r"2 of 3 volumes .* are skipped \(crop 11x11\): 'small' \(12x10 slices\), "
                                             r"'tiny' \(6x6 slices\)") as rec:
        ds = SliceDataset(mixed, ("MR",), crop=11, flip=True, seed=4)
    assert len([w for w in rec if "skipped" in str(w.message)]) == 1
    assert ds.skipped == 2 and ds.skipped_ids == ["small", "tiny"]
    assert len(ds) == 3 and [ds.ref(i) for i in range(3)] == [("big", 0), ("big", 1), ("big", 2)]
    store = patchstore.Store(mixed)
    for i in range(len(ds)):  # every item is from 'big', drawn for its own index
        ref = ds.ref(i)
        t = patchstore.SliceTransform.from_row(reference(4, 0, i, 20, 18, (11, 11), True, False))
        np.testing.assert_array_equal(ds[i][0].numpy(), t.apply(store.slice(ref.id, "MR", ref.slice, 0)))
    batch = ds.__getitems__([2, 0])
    np.testing.assert_array_equal(batch[0][0].numpy(), ds[2][0].numpy())
    # With ids=, only the listed volumes count; a pickled dataset keeps the reduced index.
    with pytest.warns(RuntimeWarning, match="1 of 2 volumes"):
        sub = SliceDataset(mixed, ("MR",), crop=11, ids=["tiny", "big"])
    assert sub.skipped_ids == ["tiny"] and len(sub) == 3
    import pickle
    again = pickle.loads(pickle.dumps(sub))
    assert len(again) == 3 and again.ref(0) == ("big", 0)


def test_montage_leaves_out_the_volumes_slice_dataset_leaves_out(mixed, cli, tmp_path):
    store = patchstore.open(mixed)
    ds_warn = "2 of 3 volumes .* give no item and are skipped \\(crop 11x11\\): 'small' \\(12x10 slices\\), 'tiny'"
    with pytest.warns(RuntimeWarning, match=ds_warn):
        ds = SliceDataset(mixed, ("MR",), crop=11, seed=4)
    assert ds.skipped_ids == ["small", "tiny"] and len(ds) == 3
    # The montage leaves out the same volumes (warned), so it shows the items of an index of 'big' alone.
    with pytest.warns(RuntimeWarning, match=r"montage of .*: 2 of 3 volumes give no item and are skipped \(crop "
                                            r"11x11\), as SliceDataset skips them: 'small' \(12x10 slices\), "
                                            r"'tiny' \(6x6 slices\)$"):
        sheet = store.montage(count=3, field="MR", crop=11, seed=4, labels=False)
    only_big = store.montage(count=3, field="MR", crop=11, seed=4, ids=["big"], labels=False)
    np.testing.assert_array_equal(sheet, only_big)
    with pytest.raises(ValueError, match=r"crop 21x21 is larger than the slices of every volume \('big' \(20x18"):
        store.montage(count=3, field="MR", crop=21)
    if cli is not None:
        r = subprocess.run([cli, "montage", mixed, str(tmp_path / "m.png"), "--field", "MR", "--crop", "11"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "patchstore: warning: 2 of 3 volumes give no item" in r.stderr, r.stderr
        assert "wrote " in r.stdout and "3 slices" in r.stdout, r.stdout


def test_no_volume_left_is_an_error_naming_them(mixed):
    with pytest.raises(ValueError, match=r"crop 21x21 is larger than the slices of every volume \('big' \(20x18"):
        SliceDataset(mixed, ("MR",), crop=21)
    ds = SliceDataset(mixed, ("MR",), crop=6)  # fits all: nothing skipped, no warning
    assert ds.skipped == 0 and len(ds) == 9
