"""One sampling engine: every loader takes the same options, skips the same way, and montage / export --boxes
show exactly the windows each loader serves."""

from __future__ import annotations

import subprocess
import warnings

import numpy as np
import pytest

import patchstore
from patchstore.torch import BatchLoader, PatchDataset

from conftest import EMPTY_MASK_ID

FIELDS = ["rgb", "mask"]

# (patch_size, options): min_valid, positive_fraction, rectangular (with flips), a subset.
CASES = [
    (12, dict(require="mask", min_valid=20)),
    (12, dict(require="mask", positive_fraction=0.4, flip=True, rot90=True)),
    ((8, 20), dict(require="mask", min_valid=0.1, flip=True)),
    (10, dict(require="mask", ids=["video02/0007", EMPTY_MASK_ID, "video01/0003", 4])),
]


def quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*a, **kw)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_montage_shows_the_windows_each_loader_serves(frameset, case):
    patch, opts = CASES[case]
    k, seed, epoch, count = 3, 5, 2, 40
    sampler = quiet(patchstore.PatchSampler, frameset.store, FIELDS, patch, k, seed=seed, **opts)
    loader = quiet(BatchLoader, frameset.store, FIELDS, patch, 7, k, seed=seed, **opts)
    dataset = quiet(PatchDataset, frameset.store, FIELDS, patch, k, seed=seed, **opts)
    store = patchstore.open(frameset.store)
    # PatchSampler / BatchLoader: the epoch's windows in order, continuing into the next epoch.
    served = np.concatenate([sampler.windows(e).array for e in range(epoch, epoch + count + 1)])[:count]
    # The BatchLoader's first batch of the epoch holds exactly the first 7 of those windows.
    loader.set_epoch(epoch)
    first = next(iter(loader))
    want = sampler.gather_windows(served[:7])
    for f in FIELDS:
        np.testing.assert_array_equal(first[f].numpy(), want[f])
    # PatchDataset: items 0, 1, ... in index order, k windows each.
    n = len(dataset)
    rows = [dataset.windows(i % n, epoch=epoch + i // n) for i in range(-(-count // k))]
    items = np.concatenate(rows)[:count]
    for kind, obj, want in (("sampler", sampler, served), ("batchloader", loader, served),
                            ("patchdataset", dataset, items)):
        for source in (kind, obj):  # by name with the options, or the loader object itself
            kw = dict(loader=source, epoch=epoch, return_windows=True, overlay="mask")
            if isinstance(source, str):
                kw.update(opts, patch_size=patch, patches_per_sample=k, seed=seed)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                sheet, shown = store.montage(count, **kw)
            assert sheet.ndim == 3 and sheet.dtype == np.uint8
            np.testing.assert_array_equal(shown, want, err_msg=f"{kind} via {type(source).__name__}")
            skipped = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
            if opts.get("positive_fraction") is None:
                # The empty frame is skipped (in the subset too), reported in one warning.
                assert len(skipped) == 1 and EMPTY_MASK_ID in skipped[0], skipped
                assert not (shown[:, 0] == store.ids.index(EMPTY_MASK_ID)).any()
            if "ids" in opts:
                allowed = {store.ids.index(i) if isinstance(i, str) else i for i in opts["ids"]}
                assert set(shown[:, 0]) <= allowed
    # Every drawn window meets the mask rule (rectangles included).
    h, w = (patch, patch) if isinstance(patch, int) else patch
    mv = opts.get("min_valid", 1)
    need = int(np.ceil(mv * h * w)) if mv < 1 else int(mv)
    if opts.get("positive_fraction") is None:
        for s, y, x, *_ in np.concatenate([served, items]):
            m = np.asarray(store.get(int(s), "mask"))[0, y:y + h, x:x + w]
            assert (m != 0).sum() >= need


def test_loaders_take_the_same_options_and_skip_the_same_way(frameset):
    for make in (lambda **kw: patchstore.PatchSampler(frameset.store, FIELDS, (8, 20), 2, **kw),
                 lambda **kw: BatchLoader(frameset.store, FIELDS, (8, 20), 4, 2, **kw),
                 lambda **kw: PatchDataset(frameset.store, FIELDS, (8, 20), 2, **kw)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            obj = make(require="mask", min_valid=2, positive_fraction=None, flip=True, seed=3,
                       ids=["video01/0001", EMPTY_MASK_ID, 2], policy="min_valid")
        msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(msgs) == 1 and "skipping 1 of 3 samples" in msgs[0] and f"'{EMPTY_MASK_ID}'" in msgs[0], msgs
        s = obj.sampler if isinstance(obj, BatchLoader) else obj
        assert s.skipped == 1
        with pytest.raises(ValueError, match="square"):
            make(rot90=True)
        with pytest.raises(KeyError, match="nope"):
            make(ids=["nope"])
        with pytest.raises(ValueError, match="policy"):
            make(policy="balanced")
    ds = quiet(PatchDataset, frameset.store, FIELDS, (8, 20), 2, require="mask", ids=["video01/0001", EMPTY_MASK_ID, 2])
    assert len(ds) == 2 and [ds.sample_of(i) for i in range(2)] == [0, 2]
    assert ds[1]["rgb"].shape == (2, 3, 8, 20)


def test_cli_montage_and_boxes_take_the_loader_and_its_options(frameset, tmp_path, cli):
    exe = cli
    if exe is None:
        pytest.skip("no patchstore CLI")
    ds = quiet(PatchDataset, frameset.store, FIELDS, (8, 20), 2, require="mask", min_valid=0.1, seed=4)
    r = subprocess.run([exe, "montage", frameset.store, str(tmp_path / "m.png"), "--count", "6", "--patch", "8,20",
                        "--field", "rgb", "--overlay", "mask", "--min-valid", "0.1", "-k", "2", "--seed", "4",
                        "--loader", "patchdataset"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "6 windows served by the patchdataset" in r.stdout
    assert r.stderr.count(f"warning: skipping {20 - len(ds)} of 20 samples") == 1 and EMPTY_MASK_ID in r.stderr
    sheet, shown = patchstore.open(frameset.store).montage(6, loader=ds, return_windows=True, overlay="mask")
    np.testing.assert_array_equal(shown, np.concatenate([ds.windows(i) for i in range(3)]))
    out = tmp_path / "boxes"
    r = subprocess.run([exe, "export", frameset.store, str(out), "--boxes", "--overlay", "mask", "--patch", "8,20",
                        "--min-valid", "0.1", "-k", "2", "--seed", "4", "--loader", "patchdataset"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    n = len(ds)
    assert f"drew {2 * n} windows served by the patchdataset on {n} frames" in r.stdout
    assert f"{20 - n} frames have none" in r.stdout
    assert r.stderr.count(f"warning: skipping {20 - n} of 20 samples") == 1
    r = subprocess.run([exe, "montage", frameset.store, str(tmp_path / "x.png"), "--loader", "dataloader"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--loader" in r.stderr


def _bench(exe, store, *flags):
    import json
    r = subprocess.run([exe, "bench", store, "--seconds", "0.1", "--processes", "1", "--json", *flags],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def test_cli_bench_gathers_the_windows_the_sampler_serves(frameset, cli):
    # Every mask holds one small rectangle (one sample's none): with --require, bench's batches are the
    # sampler's windows, each holding mask pixels; without, uniform windows that mostly miss them.
    if cli is None:
        pytest.skip("no patchstore CLI")
    flags = ["--patch", "8", "--field", "rgb", "--field", "mask", "--seed", "5", "--flip", "--batch", "24"]
    got, err = _bench(cli, frameset.store, *flags, "--require", "mask")
    s = quiet(patchstore.PatchSampler, frameset.store, FIELDS, 8, require="mask", seed=5, flip=True)
    assert (got["samples"], got["skipped"], s.eligible, s.skipped) == (19, 1, 19, 1)
    assert (got["policy"], got["require"], got["height"], got["width"], got["batch"]) == ("min_valid", "mask", 8, 8,
                                                                                       24)
    assert err.count("warning: skipping 1 of 20 samples") == 1 and EMPTY_MASK_ID in err
    # Process 0's first batch: windows 0..23 of the stream, epoch 0's 19 and then epoch 1's first 5.
    want = [s.windows(0), s.windows(1)]
    rows = np.concatenate([w.array for w in want])[:24]
    ids = (want[0].ids + want[1].ids)[:24]
    shown = got["first_windows"]
    assert [(w["id"], w["y"], w["x"], w["flip"], w["rot"]) for w in shown] == [
        (i, int(r[1]), int(r[2]), int(r[3]), int(r[4])) for i, r in zip(ids, rows)]
    assert any(w["flip"] for w in shown) and EMPTY_MASK_ID not in {w["id"] for w in shown}
    for w in shown:
        assert frameset.frames[w["id"]].mask[w["y"]:w["y"] + 8, w["x"]:w["x"] + 8].any(), w
    # The same flags without --require: the uniform sampler's windows, most of them off the rectangles.
    got, err = _bench(cli, frameset.store, *flags)
    u = patchstore.PatchSampler(frameset.store, FIELDS, 8, seed=5, flip=True)
    assert (got["samples"], got["skipped"], got["policy"], got["require"], err) == (20, 0, "uniform", None, "")
    want = [(i, int(r[1]), int(r[2])) for e in (0, 1) for i, r in zip(u.windows(e).ids, u.windows(e).array)]
    assert [(w["id"], w["y"], w["x"]) for w in got["first_windows"]] == want[:24]
    assert sum(not frameset.frames[w["id"]].mask[w["y"]:w["y"] + 8, w["x"]:w["x"] + 8].any()
               for w in got["first_windows"]) > 12


def test_cli_bench_refuses_what_images_cannot_do(frameset, cli):
    if cli is None:
        pytest.skip("no patchstore CLI")
    # No sample holds a 100x100 window (frames are 64x48): the sampler's skip report, no measurement.
    r = subprocess.run([cli, "bench", frameset.store, "--seconds", "0.1", "--patch", "100"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "no window to measure: skipping 20 of 20 samples" in r.stderr, r.stderr
    assert r.stdout == ""
    r = subprocess.run([cli, "bench", frameset.store, "--seconds", "0.1", "--patch", "8", "--crop", "8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--crop, --context and --flip=independent are for volume stores" in r.stderr
    # A value is checked by SamplerOptions::Validate, in its words.
    r = subprocess.run([cli, "bench", frameset.store, "--seconds", "0.1", "--patch", "8,12", "--rot90"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "rot90 (--rot90) needs a square window (a quarter turn of a 8x12 window is 12x8" in (
        r.stderr), r.stderr
    # Rectangles and the table's options reach the gather: -k, ids, sharding.
    got, _ = _bench(cli, frameset.store, "--patch", "6,10", "-k", "3", "--ids", "video01/0002", "video02/0005",
                    "--rank", "1", "--world-size", "2", "--batch", "4")
    s = patchstore.PatchSampler(frameset.store, ["rgb", "mask", "depth"], (6, 10), patches_per_sample=3,
                                ids=["video01/0002", "video02/0005"], rank=1, world_size=2)
    assert (got["height"], got["width"], got["channels"], got["samples"]) == (6, 10, 5, 2)
    w = s.windows(0)
    want = [(i, int(r[1]), int(r[2])) for i, r in zip(w.ids, w.array)]  # 3 windows of one visit, then epoch 1
    w1 = s.windows(1)
    want += [(i, int(r[1]), int(r[2])) for i, r in zip(w1.ids, w1.array)]
    assert [(x["id"], x["y"], x["x"]) for x in got["first_windows"]] == want[:4]
