"""What users see: bare `patchstore`, the montage overlay (mask only, outlined), non-finite values in magenta."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from PIL import Image

import patchstore

from conftest import TEMPLATES, write_exr, write_png

MAGENTA = (255, 0, 255)
S = 32  # frames of S x S; montage windows of S x S show the whole frame
GAP = 2  # montage: pixels around each tile


@pytest.fixture(scope="module")
def red_store(tmp_path_factory):
    """One frame of saturated red with a mask rectangle (rows 18..25, cols 10..20), and a depth map holding
    NaN at (20, 5), +inf at (21, 5) and -inf at (22, 5)."""
    base = tmp_path_factory.mktemp("display")
    root = base / "data"
    rgb = np.zeros((S, S, 3), np.uint8)
    rgb[..., 0] = 255
    mask = np.zeros((S, S), np.uint8)
    mask[18:26, 10:21] = 255
    depth = np.linspace(1, 2, S * S, dtype=np.float32).reshape(S, S)
    depth[20, 5], depth[21, 5], depth[22, 5] = np.nan, np.inf, -np.inf
    write_png(root / "v" / "render" / "rgb" / "0001.png", rgb)
    write_png(root / "v" / "render" / "masks" / "0001.png", mask)
    write_exr(root / "v" / "render" / "depth" / "0001.exr", {"Z": depth})
    store = str(base / "red.ps")
    patchstore.ingest_images(store, root=root, fields=TEMPLATES, durable=False, progress=False)
    return store, depth


def tile(sheet: np.ndarray, y: int, x: int):
    return tuple(int(v) for v in sheet[GAP + y, GAP + x])


def test_bare_patchstore_lists_subcommands_and_examples(cli):
    r = subprocess.run([cli], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    out = r.stdout
    for sub in ("ingest", "bench", "montage", "info", "ls", "verify", "export"):
        assert f"\n  {sub} " in out, out
    assert "Examples:\n  patchstore ingest images frames.ps" in out
    assert "patchstore montage frames.ps sheet.png" in out and "A subcommand is required" not in r.stderr


def test_overlay_must_be_a_mask(red_store, cli, tmp_path):
    store, _ = red_store
    with pytest.raises(ValueError, match=r"--overlay field 'depth' is not a mask \(mask fields: 'mask'\)"):
        patchstore.open(store).montage(count=1, patch_size=S, field="rgb", overlay="depth")
    r = subprocess.run([cli, "montage", store, str(tmp_path / "s.png"), "--count", "1", "--patch", str(S),
                        "--overlay", "rgb"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--overlay field 'rgb' is not a mask" in r.stderr, r.stderr
    assert not (tmp_path / "s.png").exists()


def test_overlay_is_outlined_so_it_shows_on_saturated_red(red_store):
    store, _ = red_store
    sheet = patchstore.open(store).montage(count=1, patch_size=S, field="rgb", overlay="mask")
    assert tile(sheet, 22, 15) == (255, 0, 0)  # translucent red on red: invisible by itself ...
    for y, x in ((18, 15), (25, 15), (22, 10), (22, 20), (18, 10)):
        assert tile(sheet, y, x) == (255, 255, 255), (y, x)  # ... so the mask's edge is white inside
    for y, x in ((17, 15), (26, 15), (22, 9), (22, 21)):
        assert tile(sheet, y, x) == (0, 0, 0), (y, x)  # and black just outside
    assert tile(sheet, 28, 3) == (255, 0, 0)  # elsewhere the image is untouched


def test_montage_draws_non_finite_values_in_magenta(red_store):
    store, depth = red_store
    sheet = patchstore.open(store).montage(count=1, patch_size=S, field="depth")
    for y in (20, 21, 22):
        assert tile(sheet, y, 5) == MAGENTA
    finite = [tile(sheet, y, x) for y in range(14, S) for x in range(S) if np.isfinite(depth[y, x])]
    assert all(p[0] == p[1] == p[2] for p in finite)  # gray: magenta only where values are not finite
    # The range is the finite one: the smallest finite value is black, the largest white.
    assert tile(sheet, S - 1, S - 1) == (255, 255, 255)


def test_png_export_draws_non_finite_values_in_magenta(red_store, tmp_path):
    store, depth = red_store
    patchstore.export(store, tmp_path / "out", fields=["depth"], format="png")
    (png,) = list((tmp_path / "out").rglob("depth.png"))
    img = np.asarray(Image.open(png))
    assert img.shape == (S, S, 3)  # a gray image holding NaN/inf is written as RGB
    for y in (20, 21, 22):
        assert tuple(int(v) for v in img[y, 5]) == MAGENTA
    ok = np.isfinite(depth)
    assert (img[ok][:, 0] == img[ok][:, 1]).all() and (img[ok][:, 1] == img[ok][:, 2]).all()
    assert img[ok][:, 0].min() == 0 and img[ok][:, 0].max() == 255
    # Without non-finite values the PNG stays gray (one channel).
    patchstore.export(store, tmp_path / "mask", fields=["mask"], format="png")
    (m,) = list((tmp_path / "mask").rglob("mask.png"))
    assert np.asarray(Image.open(m)).ndim == 2


def test_volume_slices_with_non_finite_values_are_rgb_with_magenta(tmp_path):
    import h5py

    a = np.arange(2 * 4 * 4, dtype=np.float32).reshape(2, 4, 4)
    a[1, 2, 3] = np.nan
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("CT/p", data=a)
    patchstore.ingest_hdf5(tmp_path / "v.h5", tmp_path / "v.ps", groups=["CT"], slice_axis=0, durable=False,
                           progress=False)
    patchstore.export(tmp_path / "v.ps", tmp_path / "out", format="png")
    s0 = np.asarray(Image.open(tmp_path / "out" / "p" / "CT" / "0000.png"))
    s1 = np.asarray(Image.open(tmp_path / "out" / "p" / "CT" / "0001.png"))
    assert s0.ndim == 2  # all finite: gray as before
    assert s1.shape == (4, 4, 3) and tuple(int(v) for v in s1[2, 3]) == MAGENTA
    assert (s1[..., 0] == s1[..., 1]).sum() == 15  # every other pixel gray
