"""TIFF ingest equals tifffile's decode (issue 31, item 1).

Files are written with tifffile in the layouts OpenCV decoded wrongly, ingested
with normalisation "none", and the stored float32 values compared with
tifffile.imread bit for bit. (LZW and the floating-point predictor need the
imagecodecs package in tifffile; tests/ingest/tiff_decode_test.cc covers those
with files libtiff writes.)
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import patchstore

tifffile = pytest.importorskip("tifffile")


def ingest_one(tmp_path, files, norm="none", **kw):
    """Ingests one sample whose fields are `files` ({field: file name}); returns the store."""
    (tmp_path / "m.csv").write_text("id," + ",".join(files) + "\ns," + ",".join(files.values()) + "\n")
    store = tmp_path / "s.ps"
    patchstore.ingest_images(store, manifest=tmp_path / "m.csv", norm={f: norm for f in files}, threads=1,
                             durable=False, progress=False, **kw)
    return patchstore.open(store)


def as_chw(a: np.ndarray) -> np.ndarray:
    return (a[None] if a.ndim == 2 else np.moveaxis(a, -1, 0)).astype(np.float32)


def test_planar_separate_uint16_rgb_equals_tifffile(tmp_path):
    rng = np.random.default_rng(31)
    a = rng.integers(0, 65536, size=(3, 27, 41), dtype=np.uint16)  # separate planes: (S, H, W)
    tifffile.imwrite(tmp_path / "p.tif", a, photometric="rgb", planarconfig="separate", rowsperstrip=6)
    s = ingest_one(tmp_path, {"rgb": "p.tif"})
    ref = tifffile.imread(tmp_path / "p.tif")
    assert ref.shape == (3, 27, 41) and tifffile.TiffFile(tmp_path / "p.tif").pages[0].planarconfig == 2
    np.testing.assert_array_equal(s.get(0, "rgb"), ref.astype(np.float32))
    assert s.fields["rgb"].channel_names == ("R", "G", "B")


def test_tiled_uint8_rgb_and_unassociated_alpha_equal_tifffile(tmp_path):
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, size=(50, 35, 3), dtype=np.uint8)
    rgba = rng.integers(0, 256, size=(50, 35, 4), dtype=np.uint8)
    rgba[..., 3] = np.arange(35, dtype=np.uint8) * 7  # partial alpha: premultiplying would change R, G, B
    tifffile.imwrite(tmp_path / "t.tif", rgb, photometric="rgb", tile=(16, 16), compression="zlib")
    tifffile.imwrite(tmp_path / "a.tif", rgba, photometric="rgb", extrasamples=["unassalpha"],
                     compression="zlib", predictor=True)
    s = ingest_one(tmp_path, {"rgb": "t.tif", "rgba": "a.tif"})
    np.testing.assert_array_equal(s.get(0, "rgb"), as_chw(tifffile.imread(tmp_path / "t.tif")))
    np.testing.assert_array_equal(s.get(0, "rgba"), as_chw(tifffile.imread(tmp_path / "a.tif")))
    assert s.fields["rgba"].channel_names == ("R", "G", "B", "A")


def test_float32_single_channel_is_bit_exact(tmp_path):
    rng = np.random.default_rng(5)
    f = (rng.standard_normal((23, 31)) * 1e5).astype(np.float32)
    f[0, :4] = [np.nan, -np.inf, -0.0, np.float32(1e-42)]
    tifffile.imwrite(tmp_path / "d.tif", f, compression="zlib", tile=(16, 16))
    s = ingest_one(tmp_path, {"depth": "d.tif"})
    ref = tifffile.imread(tmp_path / "d.tif")
    got = s.get(0, "depth")
    assert got.shape == (1, 23, 31)
    np.testing.assert_array_equal(got.view(np.uint32), ref[None].view(np.uint32))


def test_cmyk_is_refused_naming_the_tag(tmp_path, cli):
    tifffile.imwrite(tmp_path / "c.tif", np.full((6, 9, 4), 40, np.uint8), photometric="separated")
    with pytest.raises(Exception, match=r"c\.tif.*PhotometricInterpretation \(tag 262\) = 5"):
        ingest_one(tmp_path, {"rgb": "c.tif"})
    if cli is None:
        return
    (tmp_path / "m2.csv").write_text("id,rgb\nx,c.tif\n")
    r = subprocess.run([cli, "ingest", "images", str(tmp_path / "c2.ps"), "--manifest", str(tmp_path / "m2.csv")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "PhotometricInterpretation (tag 262) = 5 (Separated, e.g. CMYK)" in r.stderr, r.stderr


def test_int32_above_2_24_is_warned(tmp_path):
    a = np.full((8, 6), -3, np.int32)
    a[2, 3] = 50_000_001
    tifffile.imwrite(tmp_path / "i.tif", a)
    with pytest.warns(RuntimeWarning, match=r"i\.tif.*int32 values up to 50000001 exceed 2\^24"):
        s = ingest_one(tmp_path, {"depth": "i.tif"})
    got = s.get(0, "depth")
    assert got[0, 2, 3] == np.float32(50_000_001) and got[0, 0, 0] == -3


def test_float64_beyond_float32_is_warned_and_range_runs_in_float64(tmp_path):
    a = np.array([[7.5e301, -2.25e305, 3.0e-310, 4.0e38], [12.5, -6.0e300, 0.0, 1.0e39]], np.float64)
    tifffile.imwrite(tmp_path / "d.tif", a)
    # No normalisation: values beyond float32 become +-inf, said once per file.
    with pytest.warns(RuntimeWarning, match=r"d\.tif.*float64 value -2\.25e\+305 is beyond float32.*stored as -inf"):
        (tmp_path / "none").mkdir()
        s = ingest_one(tmp_path / "none", {"d": "../d.tif"})
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(s.get(0, "d")[0], a.astype(np.float32))
    # range:LO,HI maps the float64 values themselves (x - mid) / half, then to float32: not the float32 values.
    lo, hi = -3.0e305, 1.5e305
    (tmp_path / "range").mkdir()
    s = ingest_one(tmp_path / "range", {"d": "../d.tif"}, norm=f"range:{lo!r},{hi!r}")
    mid, half = lo / 2 + hi / 2, hi / 2 - lo / 2
    want = np.clip(((a - mid) / half).astype(np.float32), -1, 1)
    got = s.get(0, "d")[0]
    np.testing.assert_array_equal(got, want)
    assert got[0, 1] == np.float32((-2.25e305 - mid) / half) and got[0, 1] != 0 and -1 < got[0, 1] < 1
