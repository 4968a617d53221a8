"""Runs the README's Python examples (readme_snippet_*.py) as written, on generated data in the quick starts'
layouts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

import patchstore

from conftest import make_frames

HERE = Path(__file__).resolve().parent


def assert_clean(stderr: str) -> None:
    """Nothing on stderr but the ingest's progress lines (stderr is not a terminal here): no warnings."""
    for line in stderr.splitlines():
        assert line.startswith(("ingest: ", "ingest hdf5: ")), stderr


def test_readme_snippet_runs(tmp_path):
    # 2 videos x 2 frames of 320x272: one batch of 4 frames per epoch.
    frames = make_frames(tmp_path / "data", ["video01", "video02"], [1, 2], h=272, w=320, seed=11)
    shutil.copy(HERE / "readme_snippet_frames.py", tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="default")  # every warning shown once: there must be none
    out = subprocess.run([sys.executable, "readme_snippet_frames.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert_clean(out.stderr)
    assert out.stdout.splitlines() == [
        "0 (16, 3, 256, 256) (16, 1, 256, 256) (16, 1, 256, 256)",
        "1 (16, 3, 256, 256) (16, 1, 256, 256) (16, 1, 256, 256)",
    ]
    store = patchstore.open(tmp_path / "frames.ps")
    assert store.sealed and list(store.ids) == sorted(frames)
    for sid, fr in frames.items():
        np.testing.assert_array_equal(store[sid]["rgb"], fr.expected()["rgb"])


def test_readme_batchloader_snippet_runs(tmp_path):
    # 2 videos x 2 frames of 320x272: 16 windows, one batch per epoch.
    frames = make_frames(tmp_path / "data", ["video01", "video02"], [1, 2], h=272, w=320, seed=12)
    shutil.copy(HERE / "readme_snippet_batchloader.py", tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="default")  # every warning shown once: there must be none
    out = subprocess.run([sys.executable, "readme_snippet_batchloader.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert_clean(out.stderr)
    assert out.stdout.splitlines() == [
        "0 1 (16, 3, 256, 256) (16, 1, 256, 256)",
        "1 1 (16, 3, 256, 256) (16, 1, 256, 256)",
    ]
    assert len(patchstore.open(tmp_path / "frames.ps")) == len(frames)


def _hu_volumes(seed):
    """The volumes user's file: 2 patients of 272x272 with 24 and 16 slices, (H, W, S), gzip;
    MR int16 in 0..3000, CT float32 in -1024..3000 HU, MASK uint8 {0, 1}."""
    rng = np.random.default_rng(seed)
    shapes = (("1PA001", 24), ("1PA002", 16))
    vols = {
        "MR": {p: np.clip(rng.normal(1200, 400, (272, 272, s)), 0, 3000).astype(np.int16) for p, s in shapes},
        "CT": {p: np.clip(rng.normal(800, 500, (272, 272, s)), -1024, 3000).astype(np.float32) for p, s in shapes},
        "MASK": {p: (rng.random((272, 272, s)) < 0.5).astype(np.uint8) for p, s in shapes},
    }
    return vols


def test_readme_volumes_snippet_runs(tmp_path):
    # The snippet as written, on HU-range data (not pre-normalised): the range
    # normalisation must bring MR and CT into [-1, 1] without saturating them.
    vols = _hu_volumes(13)
    with h5py.File(tmp_path / "synthrad.h5", "w") as f:
        for g, per in vols.items():
            for p, a in per.items():
                f.create_dataset(f"{g}/{p}", data=a, compression="gzip")
    shutil.copy(HERE / "readme_snippet_volumes.py", tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="default")  # every warning shown once: there must be none
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning:patchstore.torch",
                          "readme_snippet_volumes.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert_clean(out.stderr)
    # 40 slices: one batch of 32, then 8.
    assert out.stdout.splitlines() == [
        "0 40 (8, 1, 256, 256) (8, 1, 256, 256) (8, 1, 256, 256)",
        "1 40 (8, 1, 256, 256) (8, 1, 256, 256) (8, 1, 256, 256)",
    ]
    store = patchstore.open(tmp_path / "synthrad.ps")
    assert store.sealed and list(store.ids) == ["1PA001", "1PA002"]
    assert store.fields["MR"].norm == "range[0,3000] clamp[-1,1]"
    assert store.fields["CT"].norm == "range[-1024,3000] clamp[-1,1]"
    ranges = {"MR": (0.0, 3000.0), "CT": (-1024.0, 3000.0)}
    for g, per in vols.items():
        for p, a in per.items():
            want = np.moveaxis(a, -1, 0).astype(np.float64)
            if g in ranges:
                lo, hi = ranges[g]
                want = np.clip((want - (lo + hi) / 2) / ((hi - lo) / 2), -1, 1)
            np.testing.assert_array_equal(store.volume(p, g), want.astype(np.float32))
    # What the loop saw, every batch of both epochs: MR/CT in [-1, 1] with < 1% at +-1, the mask untouched.
    import warnings

    import torch
    from torch.utils.data import DataLoader

    from patchstore.torch import SliceDataset, slice_collate
    ds = SliceDataset(tmp_path / "synthrad.ps", fields=("MR", "CT", "MASK"), crop=256, flip=True, rot90=True,
                      clamp={"MR": (-1, 1), "CT": (-1, 1)})
    at_ends = total = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no saturation warning
        for epoch in range(2):
            ds.set_epoch(epoch)
            for A, B, M in DataLoader(ds, batch_size=32, shuffle=True, collate_fn=slice_collate):
                for t in (A, B):
                    assert float(t.min()) >= -1 and float(t.max()) <= 1
                    at_ends += int(torch.count_nonzero(t.abs() == 1))
                    total += t.numel()
                assert set(M.unique().tolist()) <= {0.0, 1.0}
    assert total == 2 * 2 * 40 * 256 * 256
    assert at_ends / total < 0.01, at_ends / total
    A, B, M = ds[5]
    sid, k = ds.ref(5)
    np.testing.assert_array_equal(M.numpy(), ds.transform(5).apply(store.slice(sid, "MASK", k)))
    np.testing.assert_array_equal(B.numpy(), ds.transform(5).apply(store.slice(sid, "CT", k)))


def test_readme_volumes_workers_snippet_runs(tmp_path):
    # The DataLoader-worker form of the volumes quick start: the same items per epoch.
    vols = _hu_volumes(15)
    with h5py.File(tmp_path / "synthrad.h5", "w") as f:
        for g, per in vols.items():
            for p, a in per.items():
                f.create_dataset(f"{g}/{p}", data=a, compression="gzip")
    shutil.copy(HERE / "readme_snippet_volumes_workers.py", tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="default")  # every warning shown once: there must be none
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning:patchstore.torch",
                          "readme_snippet_volumes_workers.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert_clean(out.stderr)
    assert out.stdout.splitlines() == [
        "0 40 (8, 1, 256, 256) (8, 1, 256, 256) (8, 1, 256, 256)",
        "1 40 (8, 1, 256, 256) (8, 1, 256, 256) (8, 1, 256, 256)",
    ]
    store = patchstore.open(tmp_path / "synthrad.ps")
    assert [store.fields[g].dtype for g in ("MR", "CT", "MASK")] == ["int16", "float32", "uint8"]


def test_readme_volumes_old_clamp_on_hu_data_warns(tmp_path):
    # The README's previous example (no normalisation, clamp to [-1, 1] at read time) on HU data
    # saturated nearly every value silently; now the first batch names the field and the fraction.
    vols = _hu_volumes(14)
    with h5py.File(tmp_path / "synthrad.h5", "w") as f:
        for g, per in vols.items():
            for p, a in per.items():
                f.create_dataset(f"{g}/{p}", data=a)
    patchstore.ingest_hdf5(tmp_path / "synthrad.h5", tmp_path / "raw.ps", groups=("MR", "CT", "MASK"))
    import pytest

    from patchstore.torch import SliceDataset
    # 8 items of 64x64: 32,768 values per field, all counted (batches above 65,536 values are sampled).
    ds = SliceDataset(tmp_path / "raw.ps", fields=("MR", "CT", "MASK"), crop=64,
                      clamp={"MR": (-1, 1), "CT": (-1, 1)})
    with pytest.warns(RuntimeWarning) as rec:
        A, B, M = ds.__getitems__(list(range(8)))[0]
    msgs = [str(w.message) for w in rec if "saturated" in str(w.message)]
    assert len(msgs) == 2, msgs
    assert "field 'MR'" in msgs[0] and "field 'CT'" in msgs[1]
    ct = np.stack([ds.transform(i).apply(ds.store.slice(ds.ref(i).id, "CT", ds.ref(i).slice)) for i in range(8)])
    frac = float(((ct < -1) | (ct > 1)).mean())
    assert f"saturated {100 * frac:.2f}%" in msgs[1] and frac > 0.99
    assert "range:LO,HI" in msgs[1]
    with warnings_none():  # once per field and process
        ds.__getitems__(list(range(8, 16)))
    quiet = SliceDataset(tmp_path / "raw.ps", fields=("CT",), crop=256, clamp=(-1, 1), clamp_warn=None)
    with warnings_none():
        quiet[0]


class warnings_none:
    """Fails if a RuntimeWarning is raised inside the block."""

    def __enter__(self):
        import warnings
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error", RuntimeWarning)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)
