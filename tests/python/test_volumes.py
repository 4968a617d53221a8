"""Volume stores: patchstore.ingest_hdf5, Store.volume / slice / slice_index, patchstore.torch.SliceDataset.

Sources are written with h5py in the seed's layout: one file, groups MR, CT
and MASK, one dataset per patient, (H, W, S) gzip-chunked (h5py's automatic
chunks), or the recommended (S, H, W) with (1, H, W) chunks, uncompressed.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Sequence, Tuple

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import patchstore
from patchstore.torch import PatchDataset, SliceDataset, collate, slice_collate

GROUPS = ("MR", "CT", "MASK")

Volumes = Dict[str, Dict[str, np.ndarray]]  # group -> patient -> source array


def make_volumes(rng: np.random.Generator, patients: Dict[str, Tuple[int, int, int]],
                 dtypes: Dict[str, str] = None) -> Volumes:
    """{group: {patient: (S, H, W) array}}: MR/CT int16 with HU-like values, MASK uint8 labels."""
    dtypes = dtypes or {"MR": "int16", "CT": "int16", "MASK": "uint8"}
    out: Volumes = {g: {} for g in dtypes}
    for name, shape in patients.items():
        for g, dt in dtypes.items():
            dt = np.dtype(dt)
            if dt.kind == "f":
                a = (rng.standard_normal(shape) * 1000).astype(dt)
            elif dt == np.uint8:
                a = rng.integers(0, 3, shape, dtype=np.uint8)
            else:
                a = rng.integers(-1024, 3072, shape).astype(dt)
            out[g][name] = a
    return out


def write_h5(path: Path, vols: Volumes, layout: str = "hws") -> None:
    """layout "hws": (H, W, S) gzip with h5py's chunks (the seed); "shw": (S, H, W), (1, H, W) chunks, raw."""
    with h5py.File(path, "w") as f:
        for g, per in vols.items():
            grp = f.create_group(g)
            for name, a in per.items():
                if layout == "hws":
                    grp.create_dataset(name, data=np.ascontiguousarray(np.moveaxis(a, 0, -1)), compression="gzip")
                else:
                    grp.create_dataset(name, data=a, chunks=(1,) + a.shape[1:])


def expected(a: np.ndarray) -> np.ndarray:
    """The stored float32 values: NumPy's astype (float64 rounded to nearest)."""
    return a.astype(np.float32)


def stack_ref(vol: np.ndarray, k: int, c: int) -> np.ndarray:
    """Slices k-c .. k+c with the end slice repeated: the reference of Store.slice."""
    return vol[np.clip(np.arange(k - c, k + c + 1), 0, vol.shape[0] - 1)]


@pytest.fixture(scope="module")
def seedlike(tmp_path_factory):
    """3 patients of 24x24 with 5, 9 and 7 slices, seed layout, ingested with ingest_hdf5."""
    base = tmp_path_factory.mktemp("vols")
    vols = make_volumes(np.random.default_rng(1), {"patient001": (5, 24, 24), "patient002": (9, 24, 24),
                                                    "patient003": (7, 24, 24)})
    src = base / "synthrad.h5"
    write_h5(src, vols, "hws")
    store = base / "synthrad.ps"
    s = patchstore.ingest_hdf5(src, store, durable=False)
    assert (s.samples_written, s.samples_failed) == (3, 0)
    return vols, str(store), src


# -- ingest: values -----------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["hws", "shw"])
def test_slices_bit_exact_against_h5py(tmp_path, layout):
    vols = make_volumes(np.random.default_rng(2), {"a": (6, 20, 28), "b": (3, 20, 28)})
    write_h5(tmp_path / "v.h5", vols, layout)
    s = patchstore.ingest_hdf5(tmp_path / "v.h5", tmp_path / "v.ps", groups=GROUPS,
                               slice_axis=-1 if layout == "hws" else 0, durable=False)
    assert s.samples_written == 2
    store = patchstore.open(tmp_path / "v.ps")
    assert store.kind == "volumes" and store.sealed and list(store.ids) == ["a", "b"]
    with h5py.File(tmp_path / "v.h5", "r") as f:
        for g in GROUPS:
            for name in ("a", "b"):
                ds = f[g][name]
                S = ds.shape[-1] if layout == "hws" else ds.shape[0]
                vol = store.volume(name, g)
                assert vol.shape == (S, 20, 28) and vol.dtype == np.float32
                for k in range(S):
                    src = ds[..., k] if layout == "hws" else ds[k]  # what the seed's __getitem__ reads
                    np.testing.assert_array_equal(store.slice(name, g, k)[0], src.astype(np.float32))
                    assert store.slice(name, g, k)[0].tobytes() == src.astype(np.float32).tobytes()
    assert store.fields["MR"].source_type == "int16" and store.fields["MASK"].source_type == "uint8"
    assert store.fields["CT"].layout == "SHW" and store.fields["CT"].norm == "none"


@pytest.mark.parametrize("dtype", ["int16", "uint8", "float64"])
def test_source_types_convert_like_astype(tmp_path, dtype):
    vols = make_volumes(np.random.default_rng(3), {"p": (4, 16, 12)}, {"MR": dtype, "CT": dtype})
    if dtype == "float64":
        vols["MR"]["p"].flat[:3] = [1e-45, 0.1, -3.4e38]  # denormal, inexact, near float32's limit
    write_h5(tmp_path / "t.h5", vols)
    patchstore.ingest_hdf5(tmp_path / "t.h5", tmp_path / "t.ps", groups=["MR", "CT"], durable=False)
    store = patchstore.open(tmp_path / "t.ps")
    assert store.fields["MR"].source_type == dtype
    for g in ("MR", "CT"):
        got = store.volume("p", g)
        assert got.tobytes() == expected(vols[g]["p"]).tobytes()


def test_groups_forms_ids_masks_norm_and_progress(tmp_path):
    vols = make_volumes(np.random.default_rng(4), {"p1": (3, 8, 8), "p2": (2, 8, 8)})
    write_h5(tmp_path / "train.h5", vols)
    write_h5(tmp_path / "val.h5", make_volumes(np.random.default_rng(5), {"p9": (2, 8, 8)}))
    seen = []
    s = patchstore.ingest_hdf5([tmp_path / "train.h5", tmp_path / "val.h5"], tmp_path / "m.ps",
                               groups={"MR": "mr", "/CT": None, "MASK": "seg"}, masks=["seg"],
                               norm={"mr": "affine:0.5,1"}, durable=False, progress=lambda p: seen.append(p.done))
    assert s.samples_written == 3 and seen and seen[-1] == 3
    store = patchstore.open(tmp_path / "m.ps")
    assert list(store.ids) == ["train/p1", "train/p2", "val/p9"]
    assert list(store.fields) == ["mr", "CT", "seg"] and store.fields["seg"].is_mask
    np.testing.assert_array_equal(store.volume("train/p1", "mr"), vols["MR"]["p1"].astype(np.float32) * 0.5 + 1)
    np.testing.assert_array_equal(store.volume("train/p1", "seg"), (vols["MASK"]["p1"] != 0).astype(np.float32))
    # "GROUP=FIELD" strings, ids="name", one file.
    patchstore.ingest_hdf5(str(tmp_path / "train.h5"), tmp_path / "n.ps", groups=["MR=a", "CT"], ids="name",
                           durable=False)
    assert list(patchstore.open(tmp_path / "n.ps").fields) == ["a", "CT"]
    # Again: everything present, resumed.
    again = patchstore.ingest_hdf5(tmp_path / "train.h5", tmp_path / "n.ps", groups=["MR=a", "CT"], ids="name",
                                   durable=False)
    assert (again.samples_present, again.samples_written) == (2, 0)


# -- ingest: errors -----------------------------------------------------------------------


def _patients(f: h5py.File, shapes: Dict[Tuple[str, str], Tuple[int, ...]], default=(8, 8, 4)) -> None:
    for g in GROUPS:
        for p in ("p1", "p2", "p3"):
            shape = shapes.get((g, p), default)
            if shape is not None:
                f.create_dataset(f"{g}/{p}", data=np.ones(shape, np.int16))


@pytest.mark.parametrize("case,exc,words", [
    ("missing", KeyError, ["'p2'", "group 'CT'", "bad.h5", "missing"]),
    ("shape", ValueError, ["'p2'", "group 'CT'", "bad.h5", "8x8x5 differs from 8x8x4"]),
    ("rank", ValueError, ["'p2'", "group 'MR'", "bad.h5", "rank 2"]),
])
def test_bad_datasets_raise_naming_file_group_dataset(tmp_path, case, exc, words):
    shapes = {"missing": {("CT", "p2"): None}, "shape": {("CT", "p2"): (8, 8, 5)},
              "rank": {(g, "p2"): (8, 8) for g in GROUPS}}[case]
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        _patients(f, shapes)
    with pytest.raises(exc) as e:
        patchstore.ingest_hdf5(tmp_path / "bad.h5", tmp_path / "stop.ps", durable=False)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    # Everything before the bad volume is committed; the store is not sealed.
    stop = patchstore.open(tmp_path / "stop.ps")
    assert list(stop.ids) == ["p1"] and not stop.sealed
    # on_error="skip": recorded in the report, the others ingested.
    report = tmp_path / "errors.tsv"
    s = patchstore.ingest_hdf5(tmp_path / "bad.h5", tmp_path / "skip.ps", on_error="skip", report=report,
                               durable=False)
    assert (s.samples_written, s.samples_failed) == (2, 1) and "'p2'" in s.errors[0]
    assert report.read_text().startswith("p2\t")
    assert list(patchstore.open(tmp_path / "skip.ps").ids) == ["p1", "p3"]


def test_unreadable_files_and_bad_options(tmp_path):
    vols = make_volumes(np.random.default_rng(6), {"p": (40, 32, 32)})
    write_h5(tmp_path / "good.h5", vols)
    data = (tmp_path / "good.h5").read_bytes()
    (tmp_path / "truncated.h5").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8)
    for name in ("truncated.h5", "garbage.h5"):
        with pytest.raises(patchstore.CorruptRecordError) as e:  # an OSError
            patchstore.ingest_hdf5(tmp_path / name, tmp_path / f"{name}.ps", durable=False)
        assert name in str(e.value)
        assert isinstance(e.value, OSError)
    with pytest.raises(FileNotFoundError, match="nowhere.h5"):
        patchstore.ingest_hdf5(tmp_path / "nowhere.h5", tmp_path / "x.ps")
    assert not (tmp_path / "x.ps").exists()  # checked before anything is written
    with pytest.raises(KeyError, match="group 'PET'"):
        patchstore.ingest_hdf5(tmp_path / "good.h5", tmp_path / "g.ps", groups=["MR", "PET"], durable=False)
    with pytest.raises(ValueError, match="on_error"):
        patchstore.ingest_hdf5(tmp_path / "good.h5", tmp_path / "x.ps", on_error="ignore")
    with pytest.raises(ValueError, match="ids"):
        patchstore.ingest_hdf5(tmp_path / "good.h5", tmp_path / "x.ps", ids="first")
    with pytest.raises(ValueError, match="no groups"):
        patchstore.ingest_hdf5(tmp_path / "good.h5", tmp_path / "x.ps", groups=[])
    with pytest.raises(ValueError, match="slice-axis"):
        patchstore.ingest_hdf5(tmp_path / "good.h5", tmp_path / "x.ps", slice_axis=3)
    with pytest.raises(ValueError, match="--mask names field 'seg'"):
        patchstore.ingest_hdf5(tmp_path / "good.h5", tmp_path / "x.ps", masks=["seg"])


def test_cli_and_python_ingest_agree(seedlike, tmp_path, cli):
    assert cli is not None and os.path.exists(cli), "set PATCHSTORE_CLI to the patchstore program"
    vols, path, src = seedlike
    out = tmp_path / "cli.ps"
    subprocess.run([cli, "-q", "ingest", "hdf5", str(src), str(out), "--group", "MR", "--group", "CT",
                    "--group", "MASK", "--no-sync"], check=True, capture_output=True)
    a, b = patchstore.open(path), patchstore.open(out)
    assert list(a.ids) == list(b.ids) and a.fields == b.fields and a.sealed and b.sealed
    for sid in a.ids:
        for g in GROUPS:
            assert a.volume(sid, g).tobytes() == b.volume(sid, g).tobytes()


@pytest.mark.parametrize("axis_order", [None, "shw"])
def test_export_h5_round_trip(seedlike, tmp_path, axis_order):
    vols, path, _ = seedlike
    s = patchstore.export(path, tmp_path / "out", format="h5", axis_order=axis_order)
    assert s.files_written == 1
    with h5py.File(tmp_path / "out" / "volumes.h5", "r") as f:
        for g in GROUPS:
            for name, a in vols[g].items():
                got = f[g][name][...]
                want = expected(a) if axis_order == "shw" else np.moveaxis(expected(a), 0, -1)
                assert got.dtype == np.float32 and got.shape == want.shape
                np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="axis_order"):
        patchstore.export(path, tmp_path / "bad", format="h5", axis_order="hws")


INTERRUPTED_INGEST = """
import signal, sys, time
import patchstore
# A test run from a background job inherits SIGINT ignored (and Python then
# installs no handler): take Ctrl-C as an interactive user's process does.
signal.signal(signal.SIGINT, signal.default_int_handler)

def progress(p):
    if p.done == 5:
        print("started", flush=True)
    time.sleep(0.01)  # slow enough for the signal to arrive mid-ingest

try:
    patchstore.ingest_hdf5(sys.argv[1], sys.argv[2], groups=["MR", "CT"], slice_axis=0, durable=False,
                           progress=progress)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_stops_an_hdf5_ingest_cleanly(tmp_path):
    n = 300
    vols = make_volumes(np.random.default_rng(7), {f"p{i:03}": (2, 4, 4) for i in range(n)},
                        {"MR": "int16", "CT": "int16"})
    write_h5(tmp_path / "many.h5", vols, "shw")
    script = tmp_path / "ingest.py"
    script.write_text(INTERRUPTED_INGEST)
    store = tmp_path / "i.ps"
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path / "many.h5"), str(store)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "started"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "interrupted" in out and "finished" not in out
    s = patchstore.open(store)
    k = len(s)
    assert 5 <= k < n and not s.sealed
    assert list(s.ids) == sorted(vols["MR"])[:k]
    for sid in list(s.ids)[:: max(1, k // 5)]:
        np.testing.assert_array_equal(s.volume(sid, "CT"), expected(vols["CT"][sid]))
    again = patchstore.ingest_hdf5(tmp_path / "many.h5", store, groups=["MR", "CT"], slice_axis=0, durable=False)
    assert (again.samples_present, again.samples_written) == (k, n - k)
    assert patchstore.open(store).sealed


# -- reading slices --------------------------------------------------------------------------


def test_stacks_at_the_edges(seedlike):
    vols, path, _ = seedlike
    store = patchstore.open(path)
    for sid, a in vols["CT"].items():
        ref = expected(a)
        S = ref.shape[0]
        for c in (0, 1, 2, S + 3):  # the last: context larger than the volume
            for k in range(S):
                got = store.slice(sid, "CT", k, context=c)
                assert got.shape == (2 * c + 1, 24, 24) and not got.flags.writeable
                np.testing.assert_array_equal(got, stack_ref(ref, k, c))
    with pytest.raises(IndexError, match="slice 5"):
        store.slice("patient001", "MR", 5)
    with pytest.raises(IndexError):
        store.slice("patient001", "MR", -1)
    with pytest.raises(ValueError, match="context -1"):
        store.slice("patient001", "MR", 0, context=-1)
    with pytest.raises(KeyError):
        store.slice("patient999", "MR", 0)
    with pytest.raises(KeyError):
        store.slice("patient001", "PET", 0)


def test_zero_copy_views_keep_the_store_alive(seedlike):
    vols, path, _ = seedlike
    store = patchstore.open(path)
    vol = store.volume("patient002")
    assert set(vol) == set(GROUPS) and vol["MR"].shape == (9, 24, 24)
    inside = store.slice("patient002", "MR", 4, context=2)
    edge = store.slice("patient002", "MR", 0, context=2)
    assert np.shares_memory(inside, vol["MR"])  # a view into the map
    assert inside.ctypes.data == vol["MR"][2:7].ctypes.data
    assert not np.shares_memory(edge, vol["MR"])  # replicated: an owned copy
    for a in (vol["MR"], inside, edge):
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0, 0, 0] = 1
    store.close()
    del store
    gc.collect()
    ref = expected(vols["MR"]["patient002"])
    np.testing.assert_array_equal(vol["MR"], ref)
    np.testing.assert_array_equal(inside, ref[2:7])
    np.testing.assert_array_equal(edge, stack_ref(ref, 0, 2))


def test_slice_index(seedlike):
    vols, path, _ = seedlike
    store = patchstore.open(path)
    ix = store.slices
    want = [(sid, k) for sid in sorted(vols["MR"]) for k in range(vols["MR"][sid].shape[0])]
    assert len(ix) == 21 == len(want) and ix.volume_count == 3
    assert [tuple(r) for r in ix] == want
    assert [tuple(ix[i]) for i in range(len(ix))] == want
    assert ix[-1] == ("patient003", 6) and ix[5].id == "patient002" and ix[5].slice == 0
    assert ix.first(1) == 5 and ix.first(3) == 21 and ix.shape(1) == (9, 24, 24)
    samples, slices = ix.locate([0, 5, 20, -1])
    assert samples.tolist() == [0, 1, 2, 2] and slices.tolist() == [0, 0, 6, 6]
    with pytest.raises(IndexError):
        ix[21]
    with pytest.raises(IndexError):
        ix.locate([21])
    # A split, in the order given.
    sub = store.slice_index(["patient003", "patient001"])
    assert len(sub) == 12 and sub[0] == ("patient003", 0) and sub[7] == ("patient001", 0)
    assert sub.volumes == ["patient003", "patient001"]
    back = pickle.loads(pickle.dumps(sub))
    assert [tuple(r) for r in back] == [tuple(r) for r in sub]
    with pytest.raises(ValueError, match="twice"):
        store.slice_index(["patient001", "patient001"])


def test_frames_and_volumes_refuse_each_others_apis(seedlike, frameset):
    _, vpath, _ = seedlike
    frames = patchstore.open(frameset.store)
    sid = frames.ids[0]
    with pytest.raises(ValueError, match="not a \\(S, H, W\\) volume"):
        frames.volume(sid)
    with pytest.raises(ValueError, match="not a \\(S, H, W\\) volume"):
        frames.slice(sid, "rgb", 0)
    with pytest.raises(ValueError, match="not volumes"):
        frames.slice_index()
    with pytest.raises(ValueError, match="volume stores"):
        SliceDataset(frameset.store, ["rgb"])
    with pytest.raises(ValueError, match="image stores"):
        patchstore.PatchSampler(vpath, ["MR"], patch_size=8)
    with pytest.raises(ValueError, match="image stores"):
        PatchDataset(vpath, ["MR"], patch_size=8)


# -- SliceDataset ----------------------------------------------------------------------------------


def reference_item(store, ds: SliceDataset, i: int, epoch: int = None):
    """Item i done in NumPy on the stored volume: slice stack, crop, np.flip, np.rot90, clamp."""
    sid, k = ds.ref(i)
    t = ds.transform(i, epoch)
    out = []
    for f in ds.fields:
        vol = store.volume(sid, f)
        a = stack_ref(vol, k, ds.context)
        if t.height:
            a = a[:, t.y:t.y + t.height, t.x:t.x + t.width]
        if t.flip_v:
            a = np.flip(a, -2)
        if t.flip_h:
            a = np.flip(a, -1)
        a = np.rot90(a, t.rot90, axes=(-2, -1))
        if f in ds.clamp:
            a = np.clip(a, *ds.clamp[f])
        out.append(np.ascontiguousarray(a))
    return out


@pytest.mark.parametrize("context,crop,flip", [(0, None, True), (2, 16, "independent"), (1, (10, 10), True)])
def test_slice_dataset_items_equal_numpy_augmentation(seedlike, context, crop, flip):
    _, path, _ = seedlike
    ds = SliceDataset(path, GROUPS, context=context, crop=crop, flip=flip, rot90=True, seed=5,
                      clamp={"MR": (-500, 1500), "CT": (-1000, 1000)})
    store = patchstore.open(path)
    assert len(ds) == 21
    transforms = []
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        batch = ds.__getitems__(list(range(len(ds))))
        for i in range(len(ds)):
            item = ds[i]
            assert isinstance(item, tuple) and len(item) == 3
            want = reference_item(store, ds, i)
            for f, got, got_b, w in zip(GROUPS, item, batch[i], want):
                assert got.dtype == torch.float32 and got.shape == w.shape
                h = crop if isinstance(crop, int) else (crop[0] if crop else 24)
                assert tuple(got.shape) == (2 * context + 1, h, h)
                np.testing.assert_array_equal(got.numpy(), w, err_msg=f"item {i} field {f}")
                assert torch.equal(got, got_b)
            transforms.append(ds.transform(i))
    t = np.array(transforms)
    # All draws happen, with about the seed's probabilities (63 items).
    assert set(t[:, 6]) == {0, 1, 2, 3} and 15 <= (t[:, 6] == 0).sum() <= 48
    if flip is True:
        assert (t[:, 4] == t[:, 5]).all() and 15 <= t[:, 4].sum() <= 48  # both axes at once, as RandFlipd
    else:
        assert {(a, b) for a, b in t[:, 4:6]} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    if crop is not None:
        assert len(set(map(tuple, t[:, :2]))) > 20


def test_slice_dataset_transforms_depend_on_seed_epoch_index_only(seedlike):
    _, path, _ = seedlike
    a = SliceDataset(path, ("MR",), crop=12, flip=True, rot90=True, seed=1)
    b = SliceDataset(path, ("CT", "MR"), context=3, crop=12, flip=True, rot90=True, seed=1)
    c = SliceDataset(path, ("MR",), crop=12, flip=True, rot90=True, seed=2)
    assert [a.transform(i) for i in range(21)] == [b.transform(i) for i in range(21)]
    assert [a.transform(i) for i in range(21)] != [c.transform(i) for i in range(21)]
    assert [a.transform(i, 0) for i in range(21)] != [a.transform(i, 1) for i in range(21)]
    b.set_epoch(1)
    assert [a.transform(i, 1) for i in range(21)] == [b.transform(i) for i in range(21)]
    # The documented hash, in plain Python integers.
    def mix(z):
        z = (z + 0x9E3779B97F4A7C15) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        return z ^ (z >> 31)
    for i in range(21):
        key = mix(mix(mix(mix(1) ^ 0) ^ i) ^ 0x534C4943)
        y = ((mix(key ^ 1) >> 32) * (24 - 12 + 1)) >> 32
        x = ((mix(key ^ 2) >> 32) * (24 - 12 + 1)) >> 32
        u, v = mix(key ^ 3), mix(key ^ 4)
        rot = (1 + (((v >> 32) * 3) >> 32)) if v & 1 else 0
        assert tuple(a.transform(i, 0)) == (y, x, 12, 12, bool(u & 1), bool(u & 1), rot)


def test_slice_dataset_batch_is_one_tensor_per_field(seedlike):
    _, path, _ = seedlike
    ds = SliceDataset(path, ("MR", "CT"), context=1, crop=8, flip="independent", rot90=True)
    items = ds.__getitems__([3, 0, 20, 7])
    A, B = slice_collate(items)
    assert A.shape == B.shape == (4, 3, 8, 8)
    assert A.untyped_storage().data_ptr() == items[0][0].untyped_storage().data_ptr()  # no copy
    assert collate(items)[0].data_ptr() == A.data_ptr()
    for b, i in enumerate([3, 0, 20, 7]):
        assert torch.equal(A[b], ds[i][0]) and torch.equal(B[b], ds[i][1])
    assert ds[-1][0].shape == (3, 8, 8) and torch.equal(ds[-1][0], ds[20][0])
    with pytest.raises(IndexError):
        ds[21]
    # Items from elsewhere are stacked.
    A2, B2 = slice_collate([ds[3], ds[0]])
    assert torch.equal(A2, A[:2])


def test_slice_dataset_rejects_bad_arguments(seedlike, tmp_path):
    _, path, _ = seedlike
    with pytest.raises(KeyError, match="PET"):
        SliceDataset(path, ("MR", "PET"))
    with pytest.raises(ValueError, match="larger than"):
        SliceDataset(path, ("MR",), crop=25)
    with pytest.raises(ValueError, match="square crop"):
        SliceDataset(path, ("MR",), crop=(8, 12), rot90=True)
    with pytest.raises(ValueError, match="context"):
        SliceDataset(path, ("MR",), context=-1)
    with pytest.raises(ValueError, match="flip"):
        SliceDataset(path, ("MR",), flip="sometimes")
    with pytest.raises(ValueError, match="clamp"):
        SliceDataset(path, ("MR",), clamp={"CT": (0, 1)})
    with pytest.raises(ValueError, match="twice"):
        SliceDataset(path, ("MR", "MR"))
    # Non-square slices: rot90 only with a square crop; different sizes are fine without rot90.
    vols = make_volumes(np.random.default_rng(8), {"a": (3, 10, 14), "b": (2, 12, 16)}, {"MR": "int16"})
    write_h5(tmp_path / "r.h5", vols)
    patchstore.ingest_hdf5(tmp_path / "r.h5", tmp_path / "r.ps", groups=["MR"], durable=False)
    with pytest.raises(ValueError, match="square"):
        SliceDataset(tmp_path / "r.ps", ("MR",), rot90=True)
    ds = SliceDataset(tmp_path / "r.ps", ("MR",), flip=True)
    items = ds.__getitems__([0, 3, 4, 1])
    assert [tuple(it[0].shape) for it in items] == [(1, 10, 14), (1, 12, 16), (1, 12, 16), (1, 10, 14)]
    store = patchstore.open(tmp_path / "r.ps")
    for i, it in zip([0, 3, 4, 1], items):
        np.testing.assert_array_equal(it[0].numpy(), reference_item(store, ds, i)[0])
    ds = SliceDataset(tmp_path / "r.ps", ("MR",), crop=10, rot90=True, ids=["b"])
    assert len(ds) == 2 and ds.__getitems__([0, 1])[1][0].shape == (1, 10, 10)


def run_epochs(ds: SliceDataset, order: Sequence[int], epochs: Sequence[int], **loader_kw):
    loader = DataLoader(ds, batch_size=4, sampler=order, collate_fn=slice_collate, **loader_kw)
    out = []
    for e in epochs:
        ds.set_epoch(e)
        out.append([tuple(t.clone() for t in b) for b in loader])
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b):
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb):
            assert len(ba) == len(bb) == 3
            for x, y in zip(ba, bb):
                assert torch.equal(x, y)


@pytest.fixture(scope="module")
def slice_reference(seedlike):
    _, path, _ = seedlike
    ds = SliceDataset(path, GROUPS, context=1, crop=16, flip=True, rot90=True, seed=9,
                      clamp={"MR": (-1000, 1000), "CT": (-1000, 1000)})
    order = [int(i) for i in np.random.default_rng(0).permutation(len(ds))]
    return ds, order, run_epochs(ds, order, [0, 1], num_workers=0)


def test_slice_reference_epochs_differ(slice_reference):
    _, _, ref = slice_reference
    assert len(ref[0]) == 6 and ref[0][0][0].shape == (4, 3, 16, 16) and ref[0][-1][0].shape == (1, 3, 16, 16)
    assert not torch.equal(ref[0][0][0], ref[1][0][0])


@pytest.mark.parametrize("method,persistent", [("fork", False), ("spawn", True), ("forkserver", False)])
def test_slice_dataset_workers_give_identical_batches(slice_reference, method, persistent):
    ds, order, ref = slice_reference
    ds = pickle.loads(pickle.dumps(ds))  # a fresh copy (the shared epoch is per object)
    len(ds.store)  # opened in the parent before the workers start
    got = run_epochs(ds, order, [0, 1], num_workers=2, multiprocessing_context=method,
                     persistent_workers=persistent)
    assert_same(got, ref)


def test_flips_and_turns_are_the_seeds_monai_transforms():
    """flip=True is RandFlipd(spatial_axis=[0, 1]) when it fires; rot90 k is Rotate90(k) (RandRotate90d's k)."""
    monai = pytest.importorskip("monai.transforms")
    a = torch.arange(3 * 6 * 5, dtype=torch.float32).reshape(3, 6, 5)  # (2c+1, H, W), channel first
    flipped = monai.RandFlipd(keys=["A"], prob=1.0, spatial_axis=[0, 1])({"A": a})["A"]
    t = patchstore.SliceTransform(flip_v=True, flip_h=True)
    np.testing.assert_array_equal(np.asarray(flipped), t.apply(a.numpy()))
    for k in (1, 2, 3):
        turned = monai.Rotate90(k, spatial_axes=(0, 1))(a)
        np.testing.assert_array_equal(np.asarray(turned), patchstore.SliceTransform(rot90=k).apply(a.numpy()))
    # Flip then turn, as Compose([RandFlipd, RandRotate90d]).
    both = monai.Rotate90(1, spatial_axes=(0, 1))(flipped)
    np.testing.assert_array_equal(np.asarray(both), patchstore.SliceTransform(flip_v=True, flip_h=True,
                                                                                 rot90=1).apply(a.numpy()))
