"""Shared fixtures: small seed-like frame data written with pillow and OpenEXR, ingested once per session.

Layout as in the seed: {video}/render/rgb/{frame}.png (8-bit RGB),
{video}/render/masks/{frame}.png (8-bit gray, 0/255),
{video}/render/depth/{frame}.exr (one float32 channel "Z").
Frames are 64x48 (W x H) so the whole suite stays fast.
"""

from __future__ import annotations

import os
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
