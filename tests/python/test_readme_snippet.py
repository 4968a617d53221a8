"""Runs the README's Python examples (readme_snippet_*.py) as written, on generated seed-layout data."""

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


def test_readme_volumes_snippet_runs(tmp_path):
    # The seed's file: 2 patients of 272x272 with 24 and 16 slices, (H, W, S) float32, gzip;
    # values pre-normalised around [-1, 1] (the seed clamps A and B to [-1, 1]).
    rng = np.random.default_rng(13)
    vols = {g: {p: (rng.standard_normal((272, 272, s)) * 0.7).astype(np.float32)
                for p, s in (("1PA001", 24), ("1PA002", 16))} for g in ("MR", "CT")}
    vols["MASK"] = {p: (rng.random(a.shape) < 0.5).astype(np.float32) for p, a in vols["MR"].items()}
    with h5py.File(tmp_path / "synthrad.h5", "w") as f:
        for g, per in vols.items():
            for p, a in per.items():
                f.create_dataset(f"{g}/{p}", data=a, compression="gzip")
    shutil.copy(HERE / "readme_snippet_volumes.py", tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="default")  # every warning shown once: there must be none
    out = subprocess.run([sys.executable, "readme_snippet_volumes.py"], cwd=tmp_path, env=env,
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
    for g, per in vols.items():
        for p, a in per.items():
            np.testing.assert_array_equal(store.volume(p, g), np.moveaxis(a, -1, 0))
    # What the loop saw: clamped MR/CT, the mask untouched, every field cut and turned alike.
    from patchstore.torch import SliceDataset
    ds = SliceDataset(tmp_path / "synthrad.ps", fields=("MR", "CT", "MASK"), crop=256, flip=True, rot90=True,
                      clamp={"MR": (-1, 1), "CT": (-1, 1)})
    A, B, M = ds[5]
    assert float(A.abs().max()) <= 1 and float(B.abs().max()) <= 1 and set(M.unique().tolist()) <= {0.0, 1.0}
    sid, k = ds.ref(5)
    np.testing.assert_array_equal(M.numpy(), ds.transform(5).apply(store.slice(sid, "MASK", k)))
