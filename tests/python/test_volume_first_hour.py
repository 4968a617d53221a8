"""The volumes user's first hour (issue 17): volume montage, batch buffer reuse, shapes, ids, small points.

Small generated HDF5 files in the seed's layout; everything runs in a few seconds.
"""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path
from typing import Dict, Tuple

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

import patchstore
import patchstore.torch as pt
from patchstore.torch import PatchDataset, SliceDataset, collate, slice_collate


def write_h5(path: Path, vols: Dict[str, Dict[str, np.ndarray]]) -> None:
    """{group: {patient: (H, W, S) array}} as the seed writes it."""
    with h5py.File(path, "w") as f:
        for g, per in vols.items():
            for p, a in per.items():
                f.create_dataset(f"{g}/{p}", data=a)


def hu_volumes(rng, shapes: Dict[str, Tuple[int, int, int]]):
    """MR int16 0..3000, CT float32 -1024..3000 HU, MASK uint8 {0, 1}; shapes are (H, W, S)."""
    return {
        "MR": {p: rng.integers(0, 3000, s).astype(np.int16) for p, s in shapes.items()},
        "CT": {p: rng.uniform(-1024, 3000, s).astype(np.float32) for p, s in shapes.items()},
        "MASK": {p: (rng.random(s) < 0.3).astype(np.uint8) for p, s in shapes.items()},
    }


@pytest.fixture(scope="module")
def volstore(tmp_path_factory):
    base = tmp_path_factory.mktemp("first_hour")
    vols = hu_volumes(np.random.default_rng(5), {"p1": (40, 40, 6), "p2": (40, 40, 9), "p3": (40, 40, 4)})
    write_h5(base / "v.h5", vols)
    store = base / "v.ps"
    patchstore.ingest_hdf5(base / "v.h5", store, norm={"MR": "range:0,3000", "CT": "range:-1024,3000"},
                           durable=False)
    return str(store), vols


# -- 2. montage of a volume store shows exactly what SliceDataset serves ----------------------------


def _tiles(sheet: np.ndarray, n: int, tile: int):
    cols = int(np.ceil(np.sqrt(n)))
    for j in range(n):
        r, c = divmod(j, cols)
        yield sheet[2 + r * (tile + 2):2 + r * (tile + 2) + tile, 2 + c * (tile + 2):2 + c * (tile + 2) + tile]


def _gray(plane: np.ndarray, lo: float, hi: float) -> np.ndarray:
    u = (plane.astype(np.float64) - lo) / (hi - lo)
    return np.rint(np.clip(u, 0, 1) * 255).astype(np.uint8)


@pytest.mark.parametrize("flip", [True, "independent"])
def test_cli_montage_tiles_equal_slice_dataset_centre_slices(volstore, tmp_path, cli, flip):
    store, _ = volstore
    ds = SliceDataset(store, ("CT",), context=1, crop=24, flip=flip, rot90=True, seed=7)
    ds.set_epoch(2)
    out = tmp_path / "ct.png"
    n = 9
    args = [cli, "montage", store, str(out), "--field", "CT", "--count", str(n), "--crop", "24", "--context", "1",
            "--rot90", "--seed", "7", "--epoch", "2", "--window", "-0.5,0.75", "--tile", "24"]
    args += ["--flip"] if flip is True else ["--flip-independent"]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "window [-0.5, 0.75] in stored units" in r.stdout
    sheet = np.asarray(Image.open(out).convert("RGB"))
    items = [j * len(ds) // n for j in range(n)]
    assert len(set(ds.ref(i).id for i in items)) == 3  # every volume shows up
    for i, tile in zip(items, _tiles(sheet, n, 24)):
        (ct,) = ds[i]
        want = _gray(ct[1].numpy(), -0.5, 0.75)  # the centre slice of the (3, 24, 24) stack
        # The label covers the top rows of the tile; below it, the picture is the item.
        np.testing.assert_array_equal(tile[16:, :, 0], want[16:], err_msg=f"item {i}")
        np.testing.assert_array_equal(tile[16:, :, 1], want[16:])
    # Python gives the same sheet.
    same = patchstore.open(store).montage(count=n, field="CT", seed=7, epoch=2, crop=24, context=1, flip=flip,
                                          rot90=True, window=(-0.5, 0.75), tile=24)
    np.testing.assert_array_equal(same, sheet)


def test_montage_auto_window_overlay_ids_and_labels(volstore, cli, tmp_path):
    store, _ = volstore
    s = patchstore.open(store)
    ds = SliceDataset(store, ("MR", "MASK"), ids=["p2"])
    n = 4
    sheet = s.montage(count=n, field="MR", overlay="MASK", ids=["p2"], labels=False)
    items = [j * len(ds) // n for j in range(n)]
    planes = [ds[i] for i in items]
    vals = np.concatenate([mr.numpy().ravel() for mr, _ in planes])
    lo, hi = np.percentile(vals, 1, method="lower"), np.percentile(vals, 99, method="lower")
    for (mr, mask), tile in zip(planes, _tiles(sheet, n, 40)):
        g = _gray(mr[0].numpy(), lo, hi)
        m = mask[0].numpy() != 0
        np.testing.assert_array_equal(tile[..., 0], np.where(m, (g.astype(int) + 255) // 2, g))
        np.testing.assert_array_equal(tile[..., 1], np.where(m, g // 2, g))
    r = subprocess.run([cli, "montage", store, str(tmp_path / "a.png"), "--field", "MR", "--count", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "(auto: 1st..99th percentile)" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([cli, "montage", store, str(tmp_path / "a.png"), "--crop", "64"], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "crop 64x64 is larger than the slices of every volume ('p1' (40x40 slices)" in r.stderr, r.stderr
    r = subprocess.run([cli, "montage", store, str(tmp_path / "a.png"), "--window", "1,0"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "--window: must be a finite number pair LO,HI" in r.stderr


# -- 5. batch buffers are reused, never while held ----------------------------------------------------


def test_slice_batches_reuse_free_buffers_and_never_overwrite_held_ones(volstore):
    store, _ = volstore
    ds = SliceDataset(store, ("MR", "CT"), context=2)
    a = slice_collate(ds.__getitems__(list(range(8))))
    keep = a[0].clone()
    b = slice_collate(ds.__getitems__(list(range(8, 16))))  # `a` is held: new buffers
    assert a[0].data_ptr() != b[0].data_ptr()
    ptrs = {b[0].data_ptr(), b[1].data_ptr()}
    del b
    c = slice_collate(ds.__getitems__(list(range(4))))  # b's buffers are free again (smaller batch fits)
    assert {c[0].data_ptr(), c[1].data_ptr()} == ptrs
    torch.testing.assert_close(a[0], keep, rtol=0, atol=0)  # never overwritten
    for j in range(4):
        ref = ds.ref(j)
        np.testing.assert_array_equal(c[1][j].numpy(), ds.store.slice(ref.id, "CT", ref.slice, 2))
    view = c[0][1:2].numpy()  # a NumPy view keeps the buffer busy too
    view_copy, busy = view.copy(), c[0].data_ptr()
    del c
    d = slice_collate(ds.__getitems__(list(range(8, 12))))
    assert d[0].data_ptr() != busy
    np.testing.assert_array_equal(view, view_copy)
    assert len(ds._pool.bufs) <= 3 * 2


def test_patch_dataset_batches_reuse_buffers(volstore, frameset):
    ds = PatchDataset(frameset.store, ["rgb", "mask"], patch_size=32, patches_per_sample=2)
    a = collate(ds.__getitems__([0, 1]))
    ptr = a["rgb"].data_ptr()
    ref = a["rgb"].clone()
    b = collate(ds.__getitems__([1, 0]))
    assert b["rgb"].data_ptr() != ptr
    torch.testing.assert_close(a["rgb"], ref, rtol=0, atol=0)
    del a
    c = collate(ds.__getitems__([0, 1]))
    assert c["rgb"].data_ptr() == ptr
    torch.testing.assert_close(c["rgb"], ref, rtol=0, atol=0)


def test_pooling_off_allocates_per_batch(volstore, monkeypatch):
    monkeypatch.setattr(pt._common, "_POOL_BATCH_BUFFERS", False)
    ds = SliceDataset(volstore[0], ("MR",))
    ds[0]
    assert "_pool" not in ds.__dict__


def test_cli_bench_measures_slices_and_stacks_of_a_volume_store(volstore, cli):
    store, _ = volstore
    r = subprocess.run([cli, "bench", store, "--seconds", "0.1", "--processes", "1", "--batch", "4", "--context",
                        "2", "--crop", "32", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["kind"], d["height"], d["width"], d["fields"], d["batch"]) == ("volumes", 32, 32, 3, 4)
    assert [(x["context"], x["processes"]) for x in d["runs"]] == [(0, 1), (2, 1)]
    assert all(x["items_per_s"] > 0 for x in d["runs"])
    r = subprocess.run([cli, "bench", store, "--seconds", "0.1", "--crop", "41"], capture_output=True, text=True)
    assert r.returncode == 1 and "--crop 41 is larger than the 40x40 slices of volume 'p1'" in r.stderr


# -- 6. export --window is in stored units, accepts auto; --boxes points volume users at montage -----


def test_export_window_auto_and_stored_units_warning(volstore, cli, tmp_path):
    store, _ = volstore
    s = patchstore.open(store)
    r = subprocess.run([cli, "export", store, str(tmp_path / "a"), "--id", "p2", "--field", "CT", "--window",
                        "auto"], capture_output=True, text=True)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    vol = s.volume("p2", "CT").astype(np.float64)
    lo, hi = np.percentile(vol, 1, method="lower"), np.percentile(vol, 99, method="lower")
    for k in (0, 4, 8):
        png = np.asarray(Image.open(tmp_path / "a" / "p2" / "CT" / f"{k:04}.png"))
        want = np.rint(np.clip((vol[k] - lo) * (255.0 / (hi - lo)), 0, 255)).astype(np.uint8)
        np.testing.assert_array_equal(png, want)
    # HU window on a store normalised with range:-1024,3000: nearly flat slices, and now a warning saying why.
    r = subprocess.run([cli, "export", store, str(tmp_path / "b"), "--field", "CT", "--window", "-1024,2000"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("warning") == 1 and "field 'CT' is stored normalised (range[-1024,3000]" in r.stderr
    assert "is in stored units" in r.stderr and "--window auto" in r.stderr
    r = subprocess.run([cli, "export", store, str(tmp_path / "c"), "--window", "3,1"], capture_output=True, text=True)
    assert r.returncode == 2 and "--window: must be a finite number pair LO,HI" in r.stderr
    r = subprocess.run([cli, "export", store, str(tmp_path / "d"), "--boxes"], capture_output=True, text=True)
    assert r.returncode == 2 and "holds volumes" in r.stderr and "patchstore montage" in r.stderr
    h = subprocess.run([cli, "export", "--help"], capture_output=True, text=True).stdout
    assert "in stored units" in h and "auto" in h


# -- 4. ids across files ---------------------------------------------------------------------------


def test_relisting_a_file_next_to_a_new_one_warns_and_strict_ids_refuses(tmp_path, cli):
    rng = np.random.default_rng(9)
    write_h5(tmp_path / "a.h5", hu_volumes(rng, {"patient001": (8, 8, 3), "patient002": (8, 8, 3)}))
    write_h5(tmp_path / "b.h5", hu_volumes(rng, {"patient003": (8, 8, 3)}))
    write_h5(tmp_path / "a_copy.h5", hu_volumes(rng, {"patient001": (8, 8, 3)}))
    store = tmp_path / "t.ps"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patchstore.ingest_hdf5([tmp_path / "a.h5", tmp_path / "b.h5"], store, durable=False)  # distinct: silent
    # The same patient under another prefix (a copy of a.h5): warned, naming both ids and --ids name.
    with pytest.warns(RuntimeWarning, match="dataset 'patient001' would be stored 2 times, as 'a/patient001', "
                                            "'a_copy/patient001'") as rec:
        s = patchstore.ingest_hdf5([tmp_path / "a_copy.h5", tmp_path / "b.h5"], store, durable=False)
    assert "--ids name" in str(rec[0].message) and s.warnings == [str(rec[0].message)[len("patchstore.ingest_hdf5: "):]]
    assert sorted(patchstore.open(store).ids) == ["a/patient001", "a/patient002", "a_copy/patient001",
                                                  "b/patient003"]
    # --strict-ids refuses before writing anything.
    write_h5(tmp_path / "c.h5", hu_volumes(rng, {"patient002": (8, 8, 3), "patient009": (8, 8, 3)}))
    r = subprocess.run([cli, "ingest", "hdf5", str(tmp_path / "c.h5"), str(tmp_path / "b.h5"), str(store),
                        "--group", "MR", "--group", "CT", "--group", "MASK", "--strict-ids"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--strict-ids" in r.stderr and "'a/patient002', 'c/patient002'" in r.stderr
    assert "c/patient009" not in patchstore.open(store).ids
    with pytest.raises(ValueError, match="strict-ids"):
        patchstore.ingest_hdf5([tmp_path / "c.h5", tmp_path / "b.h5"], store, strict_ids=True, durable=False)
    # The CLI prints the warning too.
    r = subprocess.run([cli, "ingest", "hdf5", str(tmp_path / "c.h5"), str(tmp_path / "b.h5"), str(store),
                        "--group", "MR", "--group", "CT", "--group", "MASK"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.count("patchstore: warning:") == 1, r.stderr


# -- 3. a wrong slice axis is visible; 6. an empty mask is reported ----------------------------------


def test_thin_slices_and_empty_masks_warn_at_ingest(tmp_path):
    rng = np.random.default_rng(3)
    # (S, H, W) = (12, 48, 48) data ingested with the default slice axis (-1): 48 slices of 12x48.
    vols = {g: {"p1": np.moveaxis(a, -1, 0).copy()} for g, a in
            ((g, per["p1"]) for g, per in hu_volumes(rng, {"p1": (48, 48, 12)}).items())}
    vols["MASK"]["p1"][:] = 0
    write_h5(tmp_path / "shw.h5", vols)
    with pytest.warns(RuntimeWarning) as rec:
        patchstore.ingest_hdf5(tmp_path / "shw.h5", tmp_path / "wrong.ps", durable=False)
    msgs = [str(w.message) for w in rec]
    assert any("'p1' 12x48x48 gives 48 slices of 12x48 along --slice-axis 2; --slice-axis 0 would give 12 "
               "slices of 48x48" in m for m in msgs), msgs
    assert any("field 'MASK'" in m and "is all zero" in m for m in msgs), msgs
    with pytest.warns(RuntimeWarning) as rec:
        patchstore.ingest_hdf5(tmp_path / "shw.h5", tmp_path / "right.ps", slice_axis=0, durable=False)
    assert [m for m in (str(w.message) for w in rec) if "slice" in m and "thinner" in m] == []


# -- 3. shapes visible: info, info --all, ls --json, FieldInfo.shape ---------------------------------


def test_shapes_of_volumes_of_different_depths_are_visible(volstore, cli):
    store, vols = volstore
    want = {p: (a.shape[2], a.shape[0], a.shape[1]) for p, a in vols["MR"].items()}  # (S, H, W)
    s = patchstore.open(store)
    assert s.fields["MR"].shape is None and s.fields["MR"].layout == "SHW"
    assert s.shapes("CT") == want and s.shape("p2", "MR") == want["p2"]
    r = subprocess.run([cli, "info", store], capture_output=True, text=True, check=True).stdout
    assert r.count("shapes: S=4..9 H=40 W=40 (3 shapes); --all lists each sample") == 3
    r = subprocess.run([cli, "info", store, "--all"], capture_output=True, text=True, check=True).stdout
    assert "  p1: MR 6x40x40, CT 6x40x40, MASK 6x40x40\n" in r and "  p3: MR 4x40x40" in r
    d = json.loads(subprocess.run([cli, "info", store, "--json", "--all"], capture_output=True, text=True,
                                  check=True).stdout)
    assert d["fields"][0]["shape"] is None
    assert d["fields"][0]["shape_range"] == {"min": [4, 40, 40], "max": [9, 40, 40], "distinct": 3}
    assert {x["id"]: tuple(x["shapes"]["CT"]) for x in d["sample_shapes"]} == want
    ls = json.loads(subprocess.run([cli, "ls", store, "--json"], capture_output=True, text=True, check=True).stdout)
    assert [x["id"] for x in ls] == ["p1", "p2", "p3"]
    assert {x["id"]: tuple(x["shapes"]["MASK"]) for x in ls} == want


def test_frame_store_field_shape_is_unchanged(frameset):
    s = patchstore.open(frameset.store)
    first = s.ids[0]
    assert s.fields["rgb"].shape == s.shape(first, "rgb")


# -- 6. the smaller points ----------------------------------------------------------------------------


def test_ids_as_a_string_or_empty_are_clear_errors(volstore):
    store, _ = volstore
    with pytest.raises(TypeError, match=r"not the single string 'p2' \(did you mean ids=\['p2'\]\?\)"):
        SliceDataset(store, ("MR",), ids="p2")
    with pytest.raises(TypeError, match="single string 'p2'"):
        patchstore.open(store).slice_index("p2")
    with pytest.raises(ValueError, match=r"ids=\[\] selects no volume"):
        SliceDataset(store, ("MR",), ids=[])
    assert len(SliceDataset(store, ("MR",), ids=["p2"])) == 9


def test_mixed_slice_sizes_without_crop_warn_and_fail_with_a_clear_message(tmp_path):
    rng = np.random.default_rng(2)
    write_h5(tmp_path / "m.h5", hu_volumes(rng, {"small": (16, 16, 3), "big": (24, 20, 2)}))
    patchstore.ingest_hdf5(tmp_path / "m.h5", tmp_path / "m.ps", durable=False)
    with pytest.warns(RuntimeWarning, match=r"slices of 2 sizes \(24x20 \('big'\), 16x16 \('small'\)\) and no crop"):
        ds = SliceDataset(tmp_path / "m.ps", ("MR", "CT"))
    with pytest.raises(ValueError, match=r"slice_collate: the items of this batch have 2 different shapes "
                                         r"\(\(1, 16, 16\), \(1, 24, 20\)\).*give SliceDataset a crop"):
        slice_collate(ds.__getitems__([0, 4]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cropped = SliceDataset(tmp_path / "m.ps", ("MR", "CT"), crop=16)
    a, b = slice_collate(cropped.__getitems__([0, 4]))
    assert a.shape == (2, 1, 16, 16)


# -- 1. range:LO,HI in Python, for images and volumes ----------------------------------------------------


def test_range_normalisation_images_exact_and_export_inverts(tmp_path, cli):
    from conftest import make_frames

    frames = make_frames(tmp_path / "data", ["v1"], [1], h=24, w=32, seed=4)
    store = tmp_path / "f.ps"
    patchstore.ingest_images(store, root=tmp_path / "data", norm={"depth": "range:10,60", "rgb": "range:0,255"},
                             fields={"rgb": "{video}/render/rgb/{frame}.png",
                                     "depth": "{video}/render/depth/{frame}.exr"})
    s = patchstore.open(store)
    assert s.fields["depth"].norm == "range[10,60] clamp[-1,1]"
    fr = frames["v1/0001"]
    want_depth = np.clip((fr.depth.astype(np.float64) - 35) / 25, -1, 1).astype(np.float32)
    np.testing.assert_array_equal(s["v1/0001"]["depth"][0], want_depth)
    rgb = np.moveaxis(fr.rgb, 2, 0).astype(np.float64)
    np.testing.assert_array_equal(s["v1/0001"]["rgb"], ((rgb - 127.5) / 127.5).astype(np.float32))
    assert s["v1/0001"]["rgb"].min() >= -1 and s["v1/0001"]["rgb"].max() <= 1
    # PNG export inverts range like the other normalisations: pixel-identical 8-bit RGB.
    r = subprocess.run([cli, "export", str(store), str(tmp_path / "out"), "--field", "rgb"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "out" / "v1" / "0001" / "rgb.png")), fr.rgb)


def test_range_normalisation_errors(tmp_path):
    write_h5(tmp_path / "e.h5", hu_volumes(np.random.default_rng(1), {"p": (8, 8, 2)}))
    for spec, words in (("range:3000,-1024", "LO < HI"), ("range:0,1+clamp:-1,1", "already clamps"),
                        ("range:a,b", "two finite numbers")):
        with pytest.raises(ValueError, match=words):
            patchstore.ingest_hdf5(tmp_path / "e.h5", tmp_path / "e.ps", norm={"CT": spec}, durable=False)


def test_pickled_datasets_leave_their_buffers_behind(volstore, frameset):
    import pickle

    ds = SliceDataset(volstore[0], ("MR", "CT"), context=1)
    ds.__getitems__([0, 1])  # batches come from the pool (single items take their own path)
    assert ds._pool.bufs
    clone = pickle.loads(pickle.dumps(ds))
    assert "_pool" not in clone.__dict__
    torch.testing.assert_close(clone[3][1], ds[3][1], rtol=0, atol=0)
    pd = PatchDataset(frameset.store, ["rgb"], patch_size=16)
    pd.__getitems__([0, 1])
    assert "_pool" in pd.__dict__
    assert "_pool" not in pickle.loads(pickle.dumps(pd)).__dict__


def test_python_export_window_auto_and_warning(volstore, tmp_path):
    store, _ = volstore
    s = patchstore.export(store, tmp_path / "a", ids=["p3"], fields=["MR"], window="auto")
    assert s.files_written == 4 and s.warnings == []
    vol = patchstore.open(store).volume("p3", "MR").astype(np.float64)
    lo, hi = np.percentile(vol, 1, method="lower"), np.percentile(vol, 99, method="lower")
    png = np.asarray(Image.open(tmp_path / "a" / "p3" / "MR" / "0002.png"))
    np.testing.assert_array_equal(png, np.rint(np.clip((vol[2] - lo) * (255.0 / (hi - lo)), 0, 255)).astype(np.uint8))
    with pytest.warns(RuntimeWarning, match="field 'MR' is stored normalised .* is in stored units"):
        patchstore.export(store, tmp_path / "b", ids=["p3"], fields=["MR"], window=(0, 3000))
