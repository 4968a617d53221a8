"""patchstore.PatchSampler and patchstore.torch.BatchLoader: exact windows, uniformity, determinism, shards, buffers."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import patchstore
from patchstore import PatchSampler
from patchstore.torch import BatchLoader, PatchDataset

from conftest import EMPTY_MASK_ID, H, W, write_exr, write_png

FIELDS = ["rgb", "mask", "depth"]


def counts(mask: np.ndarray, p: int) -> np.ndarray:
    """Brute force: (ny, nx) valid-pixel count of the p x p window at each corner."""
    return np.lib.stride_tricks.sliding_window_view(mask != 0, (p, p)).sum(axis=(2, 3))


def make_store(path: Path, masks: dict, seed: int = 0) -> str:
    """A store with one sample per mask (rgb png, mask png, depth exr) from a manifest."""
    rng = np.random.default_rng(seed)
    lines = ["id,rgb,mask,depth"]
    for sid, mask in masks.items():
        h, w = mask.shape
        d = path.parent / (path.name + "-in") / sid
        write_png(d / "rgb.png", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        write_png(d / "mask.png", (mask != 0).astype(np.uint8) * 255)
        write_exr(d / "depth.exr", {"Z": rng.random((h, w), dtype=np.float32)})
        lines.append(f"{sid},{sid}/rgb.png,{sid}/mask.png,{sid}/depth.exr")
    manifest = path.parent / (path.name + "-in") / "manifest.csv"
    manifest.write_text("\n".join(lines) + "\n")
    patchstore.ingest_images(path, manifest=manifest, durable=False)
    return str(path)


MASK_H, MASK_W = 20, 24


def mask_cases() -> dict:
    rng = np.random.default_rng(42)
    m = {}
    m["blob"] = np.zeros((MASK_H, MASK_W), np.uint8)
    m["blob"][6:11, 9:15] = 1
    m["dots"] = (rng.random((MASK_H, MASK_W)) < 0.06).astype(np.uint8)
    m["one"] = np.zeros((MASK_H, MASK_W), np.uint8)
    m["one"][0, MASK_W - 1] = 1  # a corner pixel: reachable by one window only
    m["empty"] = np.zeros((MASK_H, MASK_W), np.uint8)
    m["full"] = np.ones((MASK_H, MASK_W), np.uint8)
    m["stripes"] = np.zeros((MASK_H, MASK_W), np.uint8)
    m["stripes"][:, ::7] = 1
    return m


@pytest.fixture(scope="module")
def masks_store(tmp_path_factory):
    cases = mask_cases()
    return make_store(tmp_path_factory.mktemp("masks") / "masks.ps", cases), cases


# -- exact windows ------------------------------------------------------------------


@pytest.mark.parametrize("min_valid", [1, 4, 0.5])
def test_windows_satisfy_min_valid_brute_force(masks_store, min_valid):
    path, cases = masks_store
    P, k = 6, 64
    s = PatchSampler(path, FIELDS, P, patches_per_sample=k, require="mask", min_valid=min_valid, seed=1)
    store = s.store
    thr = int(np.ceil(min_valid * P * P)) if min_valid < 1 else min_valid
    valid = {sid: counts(m, P) >= thr for sid, m in cases.items()}
    eligible = sorted(sid for sid, v in valid.items() if v.any())
    assert s.eligible == len(eligible) and s.skipped == len(cases) - len(eligible)
    assert sorted(s.skipped_ids) == sorted(set(cases) - set(eligible))
    assert sorted(store.ids[i] for i in np.flatnonzero(s.eligibility())) == eligible
    assert len(s) == len(eligible) * k
    seen = {sid: np.zeros_like(v) for sid, v in valid.items()}
    for epoch in range(100):
        b, wins = s.gather(epoch, 0, len(s), return_windows=True)
        # Every window: inside the frame, enough valid pixels (by brute force and in the gathered mask).
        assert (wins.y >= 0).all() and (wins.y <= MASK_H - P).all() and (wins.x <= MASK_W - P).all()
        assert (b["mask"].reshape(len(s), -1).sum(axis=1) >= thr).all()
        for sid, y, x in zip(wins.ids, wins.y, wins.x):
            assert valid[sid][y, x], (sid, y, x)
            seen[sid][y, x] = True
        # Every eligible sample is visited k times per epoch.
        assert sorted(wins.ids) == sorted(eligible * k)
    for sid in eligible:  # 6400 draws per sample reach every admissible window
        np.testing.assert_array_equal(seen[sid], valid[sid], err_msg=sid)


def test_positive_fraction(masks_store):
    path, cases = masks_store
    P, thr = 6, 4
    s = PatchSampler(path, ["mask"], P, patches_per_sample=200, require="mask", min_valid=thr,
                     positive_fraction=0.25, seed=3)
    assert s.skipped == 0  # with positive_fraction every sample has some window
    b, wins = s.gather(0, 0, len(s), return_windows=True)
    got = b["mask"].reshape(len(s), -1).sum(axis=1)
    np.testing.assert_array_equal(got >= thr, wins.positive)
    for sid in ("blob", "dots", "stripes"):  # both kinds exist: about a quarter positive
        sel = np.array([i == sid for i in wins.ids])
        assert 0.15 < wins.positive[sel].mean() < 0.35, sid
    for sid in ("empty", "one"):  # no positive window: negatives only
        assert not wins.positive[np.array([i == sid for i in wins.ids])].any()
    full = np.array([i == "full" for i in wins.ids])
    assert wins.positive[full].all()  # no negative window: positives only


def test_uniformity_chi_square(tmp_path):
    # One sample, a fixed seed, a fixed bound: draws over the admissible windows are uniform.
    mask = np.zeros((14, 16), np.uint8)
    mask[3:6, 4:7] = 1
    mask[11, 13] = 1
    path = make_store(tmp_path / "one.ps", {"only": mask}, seed=5)
    P = 4
    valid = counts(mask, P) >= 1
    m = int(valid.sum())
    s = PatchSampler(path, ["mask"], P, patches_per_sample=500, require="mask", seed=2024)
    n = 200 * m
    _, wins = s.batch(n, return_windows=True)  # continues across many epochs
    assert s.epoch == n // 500 and s.cursor == n % 500
    hist = np.zeros(valid.shape, np.int64)
    np.add.at(hist, (wins.y, wins.x), 1)
    assert not hist[~valid].any()
    expected = n / m
    chi2 = float((((hist[valid] - expected) ** 2) / expected).sum())
    df = m - 1
    # For df ~ 40 the 1e-6 tails are far outside [df - 6 sqrt(2 df), df + 7 sqrt(2 df)].
    assert df - 6 * np.sqrt(2 * df) < chi2 < df + 7 * np.sqrt(2 * df), (chi2, df)


def test_empty_mask_is_skipped_and_counted(frameset):
    s = PatchSampler(frameset.store, FIELDS, 16, patches_per_sample=4, require="mask", seed=7)
    e = s.store.ids.index(EMPTY_MASK_ID)
    assert (s.skipped, s.skipped_ids, s.eligible) == (1, [EMPTY_MASK_ID], 19)
    assert not s.eligibility()[e] and s.eligibility().sum() == 19
    assert len(s) == 19 * 4 and s.visits_per_epoch == 19
    for epoch in range(5):
        wins = s.windows(epoch)
        assert e not in set(wins.index.tolist()) and len(set(wins.index.tolist())) == 19
    uniform = PatchSampler(frameset.store, FIELDS, 16, patches_per_sample=4, seed=7)
    assert uniform.skipped == 0 and len(uniform) == 80


def test_window_larger_than_the_image(frameset):
    big = PatchSampler(frameset.store, FIELDS, H + 1)
    assert (big.skipped, big.eligible, len(big)) == (20, 0, 0)
    with pytest.raises(ValueError, match="no sample has an admissible 49x49 window"):
        big.batch(1)
    assert big.batch(0)["rgb"].shape == (0, 3, H + 1, H + 1)
    with pytest.raises(ValueError, match="no sample"):
        BatchLoader(frameset.store, FIELDS, H + 1, batch_size=4)
    with pytest.raises(ValueError, match="no sample"):
        PatchDataset(frameset.store, FIELDS, H + 1)[0]
    # Exactly the image height: every window starts on row 0.
    tall = PatchSampler(frameset.store, ["depth"], H, patches_per_sample=3)
    b, wins = tall.batch(60, return_windows=True)
    assert (wins.y == 0).all() and wins.x.max() <= W - H
    for i, (sid, x) in enumerate(zip(wins.ids, wins.x)):
        np.testing.assert_array_equal(b["depth"][i], tall.store.get(sid, "depth")[:, :, x:x + H])


def test_flips_and_rotations_equal_numpy(frameset):
    s = PatchSampler(frameset.store, FIELDS, 16, patches_per_sample=4, require="mask", seed=11,
                     flip=True, rot90=True, num_threads=2)
    b, wins = s.batch(320, return_windows=True)
    combos = set()
    for i, w in enumerate(wins):
        combos.add((w.flip, w.rot))
        for f in FIELDS:
            src = s.store.patch(w.index, f, w.y, w.x, 16, 16)
            if w.flip & 1:
                src = np.flip(src, -2)
            if w.flip & 2:
                src = np.flip(src, -1)
            np.testing.assert_array_equal(b[f][i], np.rot90(src, w.rot, axes=(-2, -1)), err_msg=f"{w} {f}")
    assert combos == {(f, r) for f in range(4) for r in range(4)}
    plain = PatchSampler(frameset.store, FIELDS, 16, patches_per_sample=4, require="mask", seed=11)
    _, pw = plain.batch(320, return_windows=True)
    # Augmentation does not move the windows.
    np.testing.assert_array_equal(pw.array[:, :3], wins.array[:, :3])
    assert not pw.flip.any() and not pw.rot.any()


# -- batches, windows, determinism ------------------------------------------------


def test_batches_do_not_depend_on_threads_or_split(frameset):
    kw = dict(patches_per_sample=4, require="mask", seed=5, flip=True)
    one = PatchSampler(frameset.store, FIELDS, 16, num_threads=1, **kw)
    two = PatchSampler(frameset.store, FIELDS, 16, num_threads=2, **kw)
    a = [one.batch(37) for _ in range(5)]  # 185 windows: crosses two epoch boundaries (76 per epoch)
    b = [two.batch(n) for n in (100, 85)]
    for f in FIELDS:
        np.testing.assert_array_equal(np.concatenate([x[f] for x in a]), np.concatenate([x[f] for x in b]))
    assert (one.epoch, one.cursor) == (two.epoch, two.cursor) == (2, 185 - 152)
    g = one.gather(1, 10, 20)
    np.testing.assert_array_equal(g["rgb"], np.concatenate([x["rgb"] for x in a])[76 + 10:76 + 30])


def test_last_windows_and_inspection(frameset):
    s = PatchSampler(frameset.store, FIELDS, 16, patches_per_sample=2, require="mask", seed=9)
    assert s.last_windows is None
    b, wins = s.batch(50, return_windows=True)
    assert s.last_windows is wins and len(wins) == 50
    for w_index, w in enumerate(wins):
        epoch, p, j = w_index // 38, (w_index % 38) // 2, w_index % 2
        assert s.window(epoch, p, j) == w
        assert w.id == s.store.ids[w.index]
        np.testing.assert_array_equal(b["rgb"][w_index], s.store.patch(w.id, "rgb", w.y, w.x, 16, 16))
    np.testing.assert_array_equal(s.windows(0).array, wins.array[:38])
    again = s.gather_windows(wins)
    for f in FIELDS:
        np.testing.assert_array_equal(again[f], b[f])
    assert "video" in repr(wins) and "PatchSampler(" in repr(s)
    with pytest.raises(IndexError):
        s.window(0, 19, 0)
    with pytest.raises(IndexError):
        s.window(0, 0, 2)


def test_batch_into_numpy_and_torch_out(frameset):
    kw = dict(patches_per_sample=4, require="mask", seed=3)
    ref = PatchSampler(frameset.store, FIELDS, 16, **kw).batch(8)
    s = PatchSampler(frameset.store, FIELDS, 16, **kw)
    out = {f: np.full(shape, np.nan, np.float32) for f, shape in s.shapes(8).items()}
    got = s.batch(8, out=out)
    assert all(got[f] is out[f] for f in FIELDS)
    for f in FIELDS:
        np.testing.assert_array_equal(out[f], ref[f])
    # torch tensors (pinned where the build has a pinned allocator), written in place.
    s.set_epoch(0)
    tens = {f: torch.full(shape, float("nan")) for f, shape in s.shapes(8).items()}
    try:
        tens["rgb"] = torch.empty(s.shapes(8)["rgb"], pin_memory=True)
        pinned = True
    except RuntimeError:
        pinned = False  # CPU-only torch: no pinned memory
    got = s.batch(8, out=tens)
    assert all(got[f] is tens[f] for f in FIELDS) and tens["rgb"].is_pinned() == pinned
    for f in FIELDS:
        np.testing.assert_array_equal(tens[f].numpy(), ref[f])

    def bad(match, **change):
        o = {f: np.empty(shape, np.float32) for f, shape in s.shapes(8).items()}
        o.update(change)
        with pytest.raises(ValueError, match=match):
            s.batch(8, out={k: v for k, v in o.items() if v is not None})

    bad(r"out\['rgb'\] has shape \(8,3,16,15\), expected \(8,3,16,16\)", rgb=np.empty((8, 3, 16, 15), np.float32))
    bad(r"out\['mask'\] must hold float32", mask=np.empty((8, 1, 16, 16), np.float64))
    bad(r"out\['depth'\] must be C-contiguous", depth=np.empty((8, 1, 16, 32), np.float32)[..., ::2])
    ro = np.empty((8, 1, 16, 16), np.float32)
    ro.flags.writeable = False
    bad(r"out\['depth'\] is read-only", depth=ro)
    bad("lacks field 'mask'", mask=None)
    bad("not gathered fields", normals=np.empty((8, 3, 16, 16), np.float32))
    bad(r"out\['rgb'\] must be float32", rgb=torch.empty((8, 3, 16, 16), dtype=torch.float64))
    bad(r"out\['rgb'\] must be contiguous", rgb=torch.empty((8, 16, 16, 3)).permute(0, 3, 1, 2))
    shared = np.empty((8, 1, 16, 16), np.float32)
    bad("share memory", mask=shared, depth=shared)
    bad("must be a writable float32 buffer", rgb=[1, 2, 3])
    with pytest.raises(ValueError, match="out must be a dict"):
        s.batch(8, out=np.empty((8, 3, 16, 16), np.float32))
    assert (s.epoch, s.cursor) == (0, 8)  # failed calls do not move the cursor


def test_returned_buffers_are_recycled_only_when_dropped(frameset):
    s = PatchSampler(frameset.store, FIELDS, 16, patches_per_sample=4, require="mask")
    b = s.batch(8)
    first = b["rgb"].ctypes.data
    del b
    b = s.batch(8)
    assert b["rgb"].ctypes.data == first  # dropped: reused
    held = b["rgb"][3]  # a view keeps the batch alive
    expect = held.copy()
    del b
    t = torch.from_numpy(s.batch(8)["depth"])  # a tensor over the arrays keeps them alive too
    c = s.batch(8)
    assert c["rgb"].ctypes.data != first
    np.testing.assert_array_equal(held, expect)  # never overwritten while referenced
    assert t.data_ptr() not in (c["depth"].ctypes.data,)
    # Different sizes get their own arrays.
    assert s.batch(3)["rgb"].shape == (3, 3, 16, 16)


def test_bad_options(frameset):
    with pytest.raises(KeyError, match="normals"):
        PatchSampler(frameset.store, ["rgb", "normals"], 16)
    with pytest.raises(ValueError, match="1-channel"):
        PatchSampler(frameset.store, ["rgb"], 16, require="rgb")
    with pytest.raises(ValueError, match="rank"):
        PatchSampler(frameset.store, ["rgb"], 16, rank=2, world_size=2)
    with pytest.raises(ValueError, match="positive_fraction needs require"):
        PatchSampler(frameset.store, ["rgb"], 16, positive_fraction=0.5)
    with pytest.raises(ValueError, match="patch_size"):
        PatchSampler(frameset.store, ["rgb"], 0)
    with pytest.raises(ValueError, match="min_valid"):
        PatchSampler(frameset.store, ["rgb"], 8, require="mask", min_valid=0)
    with pytest.raises(FileNotFoundError):
        PatchSampler(frameset.store + ".missing", ["rgb"], 8)


def _child_batch(sampler, queue):
    queue.put((os.getpid(), sampler.batch(6)["rgb"], sampler.epoch, sampler.cursor))


def test_sampler_pickles_and_survives_fork(frameset):
    s = PatchSampler(frameset.store, FIELDS, 16, patches_per_sample=4, require="mask", seed=4, flip=True)
    s.batch(70)  # near the end of epoch 0
    clone = pickle.loads(pickle.dumps(s))
    assert (clone.epoch, clone.cursor) == (0, 70) and clone.options == s.options
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_batch, args=(s, q))  # the parent's object, used in the child
    p.start()
    pid, child_rgb, epoch, cursor = q.get(timeout=60)
    p.join(30)
    assert p.exitcode == 0 and pid != os.getpid()
    want = s.batch(6)["rgb"]  # the parent continues from the same place
    np.testing.assert_array_equal(child_rgb, want)
    np.testing.assert_array_equal(clone.batch(6)["rgb"], want)
    assert (epoch, cursor) == (s.epoch, s.cursor) == (1, 0)


# -- BatchLoader ----------------------------------------------------------------------


def loader(path, **kw):
    args = dict(fields=FIELDS, patch_size=16, batch_size=10, patches_per_sample=4, require="mask", seed=7,
                flip=True, rot90=True)
    args.update(kw)
    return BatchLoader(path, **args)


def clone_all(batches):
    return [{k: v.clone() for k, v in b.items()} for b in batches]


def test_batchloader_batches_len_and_epochs(frameset):
    ld = loader(frameset.store)
    assert len(ld) == 8 and len(loader(frameset.store, drop_last=True)) == 7  # 76 windows
    s = PatchSampler(frameset.store, FIELDS, 16, patches_per_sample=4, require="mask", seed=7, flip=True,
                     rot90=True)
    assert ld.epoch == 0
    e0 = clone_all(ld)  # no set_epoch: each iter() takes the next epoch
    e1 = clone_all(ld)
    assert ld.epoch == 2
    assert [b["rgb"].shape[0] for b in e0] == [10] * 7 + [6]
    for e, batches in ((0, e0), (1, e1)):
        want = s.gather(e, 0, 76)
        for f in FIELDS:
            np.testing.assert_array_equal(torch.cat([b[f] for b in batches]).numpy(), want[f])
    ld.set_epoch(1)
    again = clone_all(ld)
    assert all(torch.equal(a["depth"], b["depth"]) for a, b in zip(again, e1))
    assert ld.epoch == 2
    dropped = clone_all(loader(frameset.store, drop_last=True))
    assert [b["rgb"].shape[0] for b in dropped] == [10] * 7
    assert all(torch.equal(a["mask"], b["mask"]) for a, b in zip(dropped, e0))


def test_batchloader_reuses_its_ring_but_never_a_held_batch(frameset):
    ld = loader(frameset.store, buffers=2)
    ptrs = []
    for batch in ld:  # the usual loop: the previous batch is dropped when the next one arrives
        ptrs.append(batch["rgb"].data_ptr())
    assert len(set(ptrs)) == 2 and ptrs[0] == ptrs[2] == ptrs[4]
    del batch  # (the loop variable still holds the last batch, and so one of the two buffers)
    ref = clone_all(ld.batches(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = list(ld.batches(3))  # all held at once: more than the ring has
    assert any("still referenced" in str(w.message) for w in caught)
    for a, b in zip(kept, ref):
        for f in FIELDS:
            assert torch.equal(a[f], b[f])  # nothing was overwritten


def test_batchloader_pin_memory(frameset):
    try:
        torch.empty(1, pin_memory=True)
        available = True
    except RuntimeError:
        available = False
    ld = loader(frameset.store, pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = clone_all(ld.batches(0))
        first = next(iter(ld.batches(0)))
    assert first["rgb"].is_pinned() == available
    assert any("pin_memory" in str(w.message) for w in caught) != available
    ref = clone_all(loader(frameset.store).batches(0))
    assert all(torch.equal(a["rgb"], b["rgb"]) for a, b in zip(batches, ref))


def iterate(dl, epochs, set_epoch=None):
    out = []
    for e in epochs:
        if set_epoch is not None:
            set_epoch(e)
        out.append(clone_all(dl))
    return out


def same(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b):
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb):
            for f in FIELDS:
                assert torch.equal(ba[f], bb[f]), f


@pytest.fixture(scope="module")
def loader_reference(frameset):
    ld = loader(frameset.store)
    return iterate(ld, [0, 1], ld.set_epoch)


@pytest.mark.parametrize("workers,threads,method,persistent", [
    (0, 1, None, False), (1, 2, "fork", False), (2, 1, "fork", False), (2, 2, "fork", True),
    (2, 1, "spawn", True),
])
def test_batchloader_in_dataloader_workers(frameset, loader_reference, workers, threads, method, persistent):
    ld = loader(frameset.store, num_threads=threads)
    kw = dict(num_workers=workers)
    if workers:
        kw.update(multiprocessing_context=method, persistent_workers=persistent)
    dl = DataLoader(ld, batch_size=None, **kw)
    assert len(dl) == 8
    # Epochs advance by themselves (no set_epoch), in the workers too.
    same(iterate(dl, [0, 1]), loader_reference)
    if workers == 2 and persistent:
        ld.set_epoch(1)  # reaches persistent workers
        same(iterate(dl, [1]), loader_reference[1:])


# -- torch.distributed: rank shards ---------------------------------------------------


def _rank_main(rank, world, port, path, require):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ld = BatchLoader(path, ["depth"], 16, batch_size=3, patches_per_sample=2, require=require, seed=13)
        assert (ld.sampler.options["rank"], ld.sampler.options["world_size"]) == (rank, world)  # from dist
        visited = []
        for epoch in (0, 1):
            wins = ld.sampler.windows(epoch)
            visited.append(wins.ids[::2])  # the sample ids of this rank's visits (k = 2 windows each)
            batches = list(ld.batches(epoch))
            assert sum(b["depth"].shape[0] for b in batches) == len(wins)
        gathered = [None] * world
        dist.all_gather_object(gathered, (visited, len(ld), ld.sampler.eligible))
        for epoch in (0, 1):
            per_rank = [g[0][epoch] for g in gathered]
            eligible = gathered[0][2]
            assert len({g[1] for g in gathered}) == 1  # equal shards
            assert all(len(v) == -(-eligible // world) for v in per_rank)
            union = [s for v in per_rank for s in v]
            assert len(set(union)) == eligible  # covering
            pad = len(union) - eligible  # DistributedSampler-style padding repeats the start
            assert pad == (-eligible) % world
            assert len(union) - len(set(union)) == pad  # disjoint up to the padding
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("world,require", [(2, None), (3, "mask")])
def test_rank_shards_are_disjoint_and_cover_with_torch_distributed(frameset, world, require):
    import torch.multiprocessing as tmp

    tmp.spawn(_rank_main, args=(world, free_port(), frameset.store, require), nprocs=world, join=True)


def test_candidate_stats_count_every_candidate_decision(masks_store):
    # Every candidate a mask-aware draw tries is decided one way (window lists,
    # the mask's block counts, or counting its mask pixels); the windows do not
    # depend on which, so two samplers with the same seed agree.
    path, cases = masks_store
    a = PatchSampler(path, FIELDS, 6, patches_per_sample=4, require="mask", seed=5)
    st = a.candidate_stats
    assert st == {"by_lists": 0, "by_blocks": 0, "by_counting": 0}
    b1, w1 = a.gather(0, 0, len(a), return_windows=True)
    st = a.candidate_stats
    assert sorted(st) == ["by_blocks", "by_counting", "by_lists"]
    assert all(isinstance(v, int) and v >= 0 for v in st.values())
    assert sum(st.values()) >= len(a)  # at least one candidate per window drawn
    b2, w2 = PatchSampler(path, FIELDS, 6, patches_per_sample=4, require="mask", seed=5).gather(
        0, 0, len(a), return_windows=True)
    assert list(w1.y) == list(w2.y) and list(w1.x) == list(w2.x)
    np.testing.assert_array_equal(b1["mask"], b2["mask"])
