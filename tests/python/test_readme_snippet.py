"""Runs the README's Python examples (readme_snippet_*.py) as written, on generated seed-layout data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import patchstore

from conftest import make_frames

HERE = Path(__file__).resolve().parent


def test_readme_snippet_runs(tmp_path):
    # 2 videos x 2 frames of 320x272: one batch of 4 frames per epoch.
    frames = make_frames(tmp_path / "data", ["video01", "video02"], [1, 2], h=272, w=320, seed=11)
    shutil.copy(HERE / "readme_snippet_frames.py", tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="ignore")  # pin_memory without an accelerator warns
    out = subprocess.run([sys.executable, "readme_snippet_frames.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
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
    env = dict(os.environ, PYTHONWARNINGS="ignore")  # pin_memory without an accelerator warns
    out = subprocess.run([sys.executable, "readme_snippet_batchloader.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "0 1 (16, 3, 256, 256) (16, 1, 256, 256)",
        "1 1 (16, 3, 256, 256) (16, 1, 256, 256)",
    ]
    assert len(patchstore.open(tmp_path / "frames.ps")) == len(frames)
