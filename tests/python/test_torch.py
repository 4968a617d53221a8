"""patchstore.torch.PatchDataset and collate: positions, values, DataLoader workers, killed workers."""

from __future__ import annotations

import os
import pickle
import signal
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import patchstore
from patchstore.torch import PatchDataset, collate

from conftest import EMPTY_MASK_ID, H, W, read_exr, write_png

FIELDS = ["rgb", "mask", "depth"]
P = 16

pytestmark = pytest.mark.filterwarnings("ignore:patchstore.torch.PatchDataset. skipping:RuntimeWarning")


def dataset(path, **kw):
    args = dict(fields=FIELDS, patch_size=P, patches_per_sample=4, require="mask", seed=7)
    args.update(kw)
    return PatchDataset(path, **args)


def windows_with_mask(mask: np.ndarray, p: int) -> np.ndarray:
    """Brute force: (ny, nx) bool, True where the p x p window at that corner holds a non-zero pixel."""
    return np.lib.stride_tricks.sliding_window_view(mask != 0, (p, p)).any(axis=(2, 3))


def seed_style_item(root, sid, ys, xs, p):
    """What the seed's Dataset computed for these corners, decoding the files (pillow + OpenEXR)."""
    video, frame = sid.split("/")
    image = np.asarray(Image.open(root / video / "render" / "rgb" / f"{frame}.png"))
    mask = np.asarray(Image.open(root / video / "render" / "masks" / f"{frame}.png"))
    depth = read_exr(root / video / "render" / "depth" / f"{frame}.exr")["Z"]
    out = {"rgb": [], "mask": [], "depth": []}
    for y, x in zip(ys, xs):
        rgb = image[y:y + p, x:x + p, :3].astype(np.float32) / 255 * 2 - 1
        out["rgb"].append(np.moveaxis(rgb, [0, 1, 2], [1, 2, 0]))
        out["mask"].append((mask[y:y + p, x:x + p] != 0).astype(np.float32)[None])
        out["depth"].append(depth[y:y + p, x:x + p][None].astype(np.float32))
    return {k: np.stack(v) for k, v in out.items()}


# -- items --------------------------------------------------------------------------


def test_items_equal_the_seed_tensors(frameset):
    ds = dataset(frameset.store)
    ids = list(ds.store.ids)
    empty = ids.index(EMPTY_MASK_ID)
    assert len(ds) == 19  # the empty-mask frame has no item
    for i in range(len(ds)):
        item = ds[i]
        s, ys, xs = ds.positions(i)
        assert s == (i if i < empty else i + 1) == ds.sample_of(i)  # item i: the i-th eligible sample
        i = s
        assert item["rgb"].shape == (4, 3, P, P) and item["mask"].shape == (4, 1, P, P)
        assert item["depth"].shape == (4, 1, P, P)
        assert all(t.dtype == torch.float32 and t.is_contiguous() for t in item.values())
        exp = seed_style_item(frameset.root, ids[i], ys, xs, P)
        for f in FIELDS:
            np.testing.assert_array_equal(item[f].numpy().view(np.uint32), exp[f].view(np.uint32))
        # require="mask": every patch holds at least one mask pixel.
        assert (item["mask"].flatten(1).sum(1) > 0).all()
    one = dataset(frameset.store, patches_per_sample=1)[0]
    assert one["rgb"].shape == (3, P, P) and one["depth"].shape == (1, P, P)


def test_valid_positions_match_brute_force(frameset):
    # The C++ sampler: eligibility and every drawn window against brute force.
    ds = dataset(frameset.store)
    # Square and rectangular (h, w) patches, through the same C++ sampler.
    for shape in ((P, P), (P, 12), (9, 21)):
        ds = dataset(frameset.store, patch_size=shape if shape[0] != shape[1] else shape[0])
        eligible = [int(s) for s in ds._eligible]
        brutes = {}
        for i, sid in enumerate(ds.store.ids):
            brute = np.lib.stride_tricks.sliding_window_view(frameset.frames[sid].mask != 0, shape).any(axis=(2, 3))
            assert (i in eligible) == bool(brute.any()), (shape, sid)
            brutes[i] = brute
        assert ds.skipped == 1 and ds.skipped_ids == [EMPTY_MASK_ID] and len(ds) == 19
        for item, s in enumerate(eligible):
            for e in range(50):
                got, ys, xs = ds.positions(item, epoch=e)
                assert got == s and brutes[s][ys, xs].all()
        assert ds[0]["rgb"].shape == (4, 3) + shape


def test_positions_uniform_over_valid_corners(frameset):
    ds = dataset(frameset.store)
    i = 2
    valid = windows_with_mask(frameset.frames[ds.store.ids[i]].mask, P)
    counts = np.zeros_like(valid, dtype=np.int64)
    for e in range(1500):
        _, ys, xs = ds.positions(i, epoch=e)
        np.add.at(counts, (ys, xs), 1)
    assert not counts[~valid].any()  # never an invalid corner
    assert (counts[valid] > 0).all()  # every valid corner is reachable
    n = valid.sum()
    mean = 6000 / n
    assert counts[valid].max() < mean + 6 * np.sqrt(mean) + 3  # no corner strongly favoured


def test_full_mask_gives_the_same_positions_as_no_requirement(tmp_path):
    img = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    write_png(tmp_path / "rgb.png", img)
    write_png(tmp_path / "mask.png", np.full((30, 40), 255, np.uint8))
    (tmp_path / "m.csv").write_text("id,rgb,mask\na,rgb.png,mask.png\n")
    patchstore.ingest_images(tmp_path / "s.ps", manifest=tmp_path / "m.csv", durable=False)
    a = PatchDataset(tmp_path / "s.ps", ["rgb"], 8, patches_per_sample=5, require="mask", seed=3)
    b = PatchDataset(tmp_path / "s.ps", ["rgb"], 8, patches_per_sample=5, require=None, seed=3)
    for e in range(20):
        pa, pb = a.positions(0, e), b.positions(0, e)
        np.testing.assert_array_equal(pa[1], pb[1])
        np.testing.assert_array_equal(pa[2], pb[2])
        assert pb[1].max() <= 30 - 8 and pb[2].max() <= 40 - 8
    assert torch.equal(a[0]["rgb"], b[0]["rgb"])


def test_positions_depend_on_seed_epoch_index_only(frameset):
    a, b = dataset(frameset.store), dataset(frameset.store)
    _ = b[5], b[9]  # a different access history
    for i in (0, 5, 18):
        np.testing.assert_array_equal(a.positions(i)[1], b.positions(i)[1])
    e0 = [a.positions(i) for i in range(len(a))]
    a.set_epoch(1)
    assert a.epoch == 1
    e1 = [a.positions(i) for i in range(len(a))]
    assert any(not np.array_equal(p[1], q[1]) or not np.array_equal(p[2], q[2]) for p, q in zip(e0, e1))
    np.testing.assert_array_equal(a.positions(3)[2], b.positions(3, epoch=1)[2])
    c = dataset(frameset.store, seed=8)
    assert any(not np.array_equal(c.positions(i)[1], e0[i][1]) for i in range(len(a)))
    with pytest.raises(ValueError):
        a.set_epoch(-1)
    with pytest.raises(IndexError):
        a[len(a)]
    assert torch.equal(a[-1]["depth"], a[len(a) - 1]["depth"])


def test_empty_mask_sample_is_skipped_with_a_warning(frameset):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = dataset(frameset.store)
        items = ds.__getitems__(list(range(len(ds))))
        _ = ds[5], ds.positions(13)
    e = ds.store.ids.index(EMPTY_MASK_ID)
    assert len(ds) == 19 and len(items) == 19  # 19 items of 4 patches: never a sample read twice
    assert [ds.sample_of(i) for i in range(19)] == [i for i in range(20) if i != e]
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1, msgs  # once, when the dataset is built
    assert msgs[0].startswith("patchstore.torch.PatchDataset: skipping 1 of 20 samples of ")
    assert f"'{EMPTY_MASK_ID}'" in msgs[0] and "no 16x16 window with >= 1 valid pixel of 'mask'" in msgs[0]
    # Patches larger than every sample: no valid position anywhere -> ValueError, not a hang.
    big = dataset(frameset.store, patch_size=(H + 1, 8))
    with pytest.raises(ValueError, match="no sample"):
        big[0]
    wide = dataset(frameset.store, patch_size=(8, W + 1), require=None)
    with pytest.raises(ValueError, match="no sample"):
        wide[3]


def test_collate_flattens_patches(frameset):
    ds = dataset(frameset.store)
    items = [ds[i] for i in (0, 1, 2)]
    batch = collate(items)
    assert batch["rgb"].shape == (12, 3, P, P) and batch["mask"].shape == (12, 1, P, P)
    for b in range(3):
        for j in range(4):
            assert torch.equal(batch["depth"][b * 4 + j], items[b]["depth"][j])
    single = dataset(frameset.store, patches_per_sample=1)
    b1 = collate([single[0], single[1]])
    assert b1["rgb"].shape == (2, 3, P, P) and torch.equal(b1["rgb"][1], single[1]["rgb"])


def test_batched_fetch_is_one_tensor_and_equals_single_items(frameset):
    ds = dataset(frameset.store)
    e = ds.store.ids.index(EMPTY_MASK_ID)
    indices = [0, 5, e, 2]
    items = ds.__getitems__(indices)  # what DataLoader's fetcher calls
    batch = collate(items)
    for f in FIELDS:
        # The items are back-to-back slices of one tensor, which collate hands on without copying.
        assert batch[f].data_ptr() == items[0][f].data_ptr()
        assert batch[f].shape == (16,) + items[0][f].shape[1:]
        for b, i in enumerate(indices):
            assert torch.equal(items[b][f], ds[i][f])
            assert torch.equal(batch[f][4 * b:4 * b + 4], ds[i][f])
    single = dataset(frameset.store, patches_per_sample=1)
    items = single.__getitems__([3, 4])
    b1 = collate(items)
    assert b1["mask"].shape == (2, 1, P, P) and b1["mask"].data_ptr() == items[0]["mask"].data_ptr()
    assert torch.equal(b1["mask"][1], single[4]["mask"])


def test_dataset_pickles_with_its_epoch(frameset):
    ds = dataset(frameset.store, transform=None)
    ds.set_epoch(3)
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.epoch == 3 and clone._sampler is None  # rebuilt on first use
    for f in FIELDS:
        assert torch.equal(clone[4][f], ds[4][f])


def depth_times_mask(item):
    return {**item, "depth": item["depth"] * item["mask"]}


def test_transform(frameset):
    ds = dataset(frameset.store, transform=depth_times_mask)
    plain = dataset(frameset.store)
    assert torch.equal(ds[1]["depth"], plain[1]["depth"] * plain[1]["mask"])


def test_rejects_bad_arguments(frameset):
    with pytest.raises(KeyError, match="normals"):
        dataset(frameset.store, fields=["rgb", "normals"])
    with pytest.raises(KeyError, match="alpha"):
        dataset(frameset.store, require="alpha")
    with pytest.raises(ValueError):
        dataset(frameset.store, patch_size=0)
    with pytest.raises(ValueError):
        dataset(frameset.store, patches_per_sample=0)
    with pytest.raises(FileNotFoundError):
        dataset(frameset.store + ".missing")


# -- DataLoader ---------------------------------------------------------------------


def run_epochs(ds, epochs, **loader_kw):
    loader = DataLoader(ds, batch_size=3, shuffle=False, collate_fn=collate, **loader_kw)
    out = []
    for e in epochs:
        ds.set_epoch(e)
        out.append([{k: v.clone() for k, v in b.items()} for b in loader])
    return out


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b):
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb):
            assert ba.keys() == bb.keys()
            for k in ba:
                assert torch.equal(ba[k], bb[k]), k


@pytest.fixture(scope="module")
def reference(frameset):
    return run_epochs(dataset(frameset.store), [0, 1], num_workers=0)


def test_reference_epochs_differ(reference):
    assert len(reference[0]) == 7 and reference[0][0]["rgb"].shape == (12, 3, P, P)
    assert reference[0][-1]["rgb"].shape == (4, 3, P, P)  # 19 = 6 * 3 + 1 items (the empty-mask frame has none)
    assert not torch.equal(reference[0][0]["rgb"], reference[1][0]["rgb"])


# The DataLoader matrix: start methods and persistent workers with 2 workers,
# and 8 workers (more workers than cores, each a slice of the epoch) with
# fork, each against the num_workers=0 reference. 8 spawned or forkserver
# workers each import torch again (~70 s on 2 cores) and test nothing 2 do not.
# Persistent workers are independent of the start method (fork checks both):
# spawn runs without, forkserver with them.
@pytest.mark.parametrize("method,persistent,workers",
                         [("fork", False, 2), ("fork", True, 2), ("spawn", False, 2), ("forkserver", True, 2),
                          ("fork", False, 8), ("fork", True, 8)])
def test_workers_give_identical_batches(frameset, reference, method, persistent, workers):
    ds = dataset(frameset.store)
    ds.store[0]  # opened in the parent before the workers start
    got = run_epochs(ds, [0, 1], num_workers=workers, multiprocessing_context=method, persistent_workers=persistent)
    assert_same_batches(got, reference)


@pytest.mark.parametrize("which", ["sealed", "live"])
def test_killed_worker_then_new_epoch(frameset, live_store, which):
    path = frameset.store if which == "sealed" else live_store
    ds = dataset(path)
    loader = DataLoader(ds, batch_size=2, shuffle=False, collate_fn=collate, num_workers=2,
                        multiprocessing_context="fork")
    it = iter(loader)
    next(it)
    raised = ""
    try:
        # torch's SIGCHLD handler may raise as soon as the worker dies, so the
        # kill is inside the try as well.
        os.kill(it._workers[0].pid, signal.SIGKILL)
        for _ in it:
            pass
    except (RuntimeError, EOFError, OSError) as e:
        # RuntimeError from torch's worker checks; EOFError / ConnectionError when a
        # batch the worker had queued points at shared memory it can no longer hand over.
        raised = f"{type(e).__name__}: {e}"
    finally:
        try:
            it._shutdown_workers()  # unregisters the worker pids from the SIGCHLD handler
        except RuntimeError as e:
            # The SIGCHLD handler may fire only now, while shutting down (its own finally
            # still unregisters the pids).
            raised = raised or f"{type(e).__name__}: {e}"
        del it
    assert raised, "the loader did not notice the killed worker"
    ref = run_epochs(dataset(frameset.store), [1], num_workers=0)
    ds.set_epoch(1)
    got = [{k: v.clone() for k, v in b.items()} for b in DataLoader(
        ds, batch_size=3, shuffle=False, collate_fn=collate, num_workers=2, multiprocessing_context="fork")]
    assert_same_batches([got], ref)


def test_min_valid_flips_and_borrowed_windows(frameset):
    ds = dataset(frameset.store, min_valid=4, flip=True, rot90=True)
    for i in range(len(ds)):
        item = ds[i]
        assert (item["mask"].flatten(1).sum(1) >= 4).all()
        rows = ds.windows(i)
        s = rows[0, 0]
        for j, (_, y, x, fl, rot, _) in enumerate(rows):
            src = ds.store.patch(int(s), "depth", int(y), int(x), P, P)
            src = np.flip(src, -2) if fl & 1 else src
            src = np.flip(src, -1) if fl & 2 else src
            np.testing.assert_array_equal(item["depth"][j].numpy(), np.rot90(src, int(rot), axes=(-2, -1)))
    # Rectangular patches take min_valid and flips too; rot90 needs a square patch.
    rect = dataset(frameset.store, patch_size=(P, 12), min_valid=0.05, flip=True)
    flips = set()
    for i in range(len(rect)):
        item, rows = rect[i], rect.windows(i)
        assert (item["mask"].flatten(1).sum(1) >= 10).all()  # ceil(0.05 * 16 * 12)
        for j, (s, y, x, fl, rot, _) in enumerate(rows):
            src = rect.store.patch(int(s), "depth", int(y), int(x), P, 12)
            src = np.flip(src, -2) if fl & 1 else src
            src = np.flip(src, -1) if fl & 2 else src
            assert rot == 0
            flips.add(int(fl))
            np.testing.assert_array_equal(item["depth"][j].numpy(), src)
    assert flips == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="square"):
        dataset(frameset.store, patch_size=(P, 12), rot90=True)


def test_info_reports_samples_with_an_empty_mask(frameset):
    """`patchstore info` names the mask field's empty samples (from the sample index), text and JSON."""
    import json
    import subprocess
    cli = os.environ.get("PATCHSTORE_CLI") or patchstore.cli_path()
    text = subprocess.run([cli, "info", frameset.store], capture_output=True, text=True, check=True).stdout
    assert f"1 sample(s) with no valid pixel (first: '{EMPTY_MASK_ID}')" in text
    info = subprocess.run([cli, "info", "--json", frameset.store], capture_output=True, text=True, check=True)
    fields = {f["name"]: f for f in json.loads(info.stdout)["fields"]}
    assert fields["mask"]["empty_masks"] == 1 and "empty_masks" not in fields["rgb"]
    # Ingest gives the mask block counts (FORMAT.md "Mask block counts"), and info says so.
    assert fields["mask"]["mask_blocks"] == 32 and "mask_blocks" not in fields["rgb"]
    assert "(mask; block counts 32x32)" in text
