"""Shared fixtures: small seed-like frame data written with pillow and OpenEXR, ingested once per session.

Layout as in the seed: {video}/render/rgb/{frame}.png (8-bit RGB),
{video}/render/masks/{frame}.png (8-bit gray, 0/255),
{video}/render/depth/{frame}.exr (one float32 channel "Z").
Frames are 64x48 (W x H) so the whole suite stays fast.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional

import numpy as np
import OpenEXR
import pytest
from PIL import Image

import patchstore

# run_with_numpy.py (CTest python_tests_numpy126) runs the suite on another NumPy: make sure it does.
_EXPECT_NUMPY = os.environ.get("PATCHSTORE_EXPECT_NUMPY")
if _EXPECT_NUMPY and np.__version__ != _EXPECT_NUMPY:
    raise RuntimeError(f"expected NumPy {_EXPECT_NUMPY} (PATCHSTORE_EXPECT_NUMPY), imported {np.__version__} "
                       f"from {np.__file__}")

# A test that runs longer than this (seconds; PATCHSTORE_TEST_TIMEOUT, 0: off)
# is stuck: every thread's Python stack goes to stderr and the run ends at
# once (exit 1), so a hang names the test and the call it waits in instead of
# using up CTest's whole timeout with no output. The slowest test takes ~30 s
# on 2 busy cores.
TEST_TIMEOUT = float(os.environ.get("PATCHSTORE_TEST_TIMEOUT", "300"))
_watchdog_out = None


def pytest_configure(config):
    # fd 2 is pytest's capture file while a test runs, and an exiting dump
    # would be lost with it: write to a copy of the real stderr, taken here
    # (outside any capture), as pytest's faulthandler plugin does.
    global _watchdog_out
    if TEST_TIMEOUT > 0 and _watchdog_out is None:
        _watchdog_out = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")


def pytest_unconfigure(config):
    global _watchdog_out
    if _watchdog_out is not None:
        _watchdog_out.close()
        _watchdog_out = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _watchdog_out is not None:
        faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True, file=_watchdog_out)
    try:
        yield
    finally:
        if _watchdog_out is not None:
            faulthandler.cancel_dump_traceback_later()


H, W = 48, 64
TEMPLATES = {
    "rgb": "{video}/render/rgb/{frame}.png",
    "mask": "{video}/render/masks/{frame}.png",
    "depth": "{video}/render/depth/{frame}.exr",
}
# The sample whose mask is empty everywhere (PatchDataset must skip it).
EMPTY_MASK_ID = "video02/0004"


def write_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def write_exr(path: Path, channels: Dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    with OpenEXR.File(header, channels) as f:
        f.write(str(path))


def read_exr(path: Path) -> Dict[str, np.ndarray]:
    with OpenEXR.File(str(path)) as f:
        return {name: np.array(ch.pixels) for name, ch in f.channels().items()}


@dataclass
class Frame:
    rgb: np.ndarray  # (H, W, 3) uint8
    mask: np.ndarray  # (H, W) uint8, 0/255
    depth: np.ndarray  # (H, W) float32

    # The values the seed's Dataset computes, as (C, H, W) float32.
    def expected(self) -> Dict[str, np.ndarray]:
        return {
            "rgb": np.moveaxis(self.rgb, 2, 0).astype(np.float32) / 255 * 2 - 1,
            "mask": (self.mask != 0).astype(np.float32)[None],
            "depth": self.depth[None].copy(),
        }


def make_frames(root: Path, videos: Iterable[str], frames: Iterable[int], h: int = H, w: int = W,
                seed: int = 0, empty: Iterable[str] = ()) -> Dict[str, Frame]:
    """Writes seed-layout frames under `root`; returns {id: Frame} with the exact pixels written."""
    rng = np.random.default_rng(seed)
    empty = set(empty)
    out: Dict[str, Frame] = {}
    for v in videos:
        for fr in frames:
            fid = f"{v}/{fr:04}"
            rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            mask = np.zeros((h, w), np.uint8)
            if fid not in empty:
                # A small blob: one rectangle at a random place.
                y0, x0 = int(rng.integers(0, h - 6)), int(rng.integers(0, w - 6))
                mask[y0:y0 + int(rng.integers(1, 6)), x0:x0 + int(rng.integers(1, 6))] = 255
            depth = (rng.random((h, w), dtype=np.float32) * 100).astype(np.float32)
            depth[0, 0] = np.float32(1e-30)  # a denormal-ish value must survive bit-exact
            write_png(root / v / "render" / "rgb" / f"{fr:04}.png", rgb)
            write_png(root / v / "render" / "masks" / f"{fr:04}.png", mask)
            write_exr(root / v / "render" / "depth" / f"{fr:04}.exr", {"Z": depth})
            out[fid] = Frame(rgb, mask, depth)
    return out


@dataclass
class FrameSet:
    root: Path
    frames: Dict[str, Frame]
    store: str  # a sealed store holding all of them


@pytest.fixture(scope="session")
def frameset(tmp_path_factory) -> FrameSet:
    """20 frames (2 videos x 10), one with an empty mask, ingested into a sealed store."""
    base = tmp_path_factory.mktemp("frames")
    root = base / "data"
    frames = make_frames(root, ["video01", "video02"], range(1, 11), empty=[EMPTY_MASK_ID])
    store = str(base / "frames.ps")
    summary = patchstore.ingest_images(store, root=str(root), fields=TEMPLATES, durable=False)
    assert summary.samples_written == len(frames)
    return FrameSet(root, frames, store)


@pytest.fixture(scope="session")
def live_store(tmp_path_factory, frameset) -> str:
    """The same frames plus one broken file, ingested with on_error="skip": an unsealed (live) store.

    Unsealed stores are read with LMDB's lock table (reader slots), unlike sealed ones.
    """
    base = tmp_path_factory.mktemp("live")
    root = base / "data"
    make_frames(root, ["video01", "video02"], range(1, 11), empty=[EMPTY_MASK_ID])  # same seed: same pixels
    bad = root / "video03" / "render"
    make_frames(root, ["video03"], [1], seed=5)
    (bad / "rgb" / "0001.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    store = str(base / "live.ps")
    summary = patchstore.ingest_images(store, root=str(root), fields=TEMPLATES, on_error="skip", durable=False)
    assert summary.samples_failed == 1 and summary.samples_written == 20
    return store


@pytest.fixture(scope="session")
def cli() -> Optional[str]:
    return os.environ.get("PATCHSTORE_CLI") or patchstore.cli_path()
