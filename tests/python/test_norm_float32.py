"""Normalisations that overflow or collapse in float32 are refused at every door (issue 31, item 2).

The transform runs in float32 (Normalization::Apply); the guard used to check in
float64, so affine:1e-50,0 stored zeros and affine:1e39,0 infinities.
"""

from __future__ import annotations

import subprocess

import h5py
import numpy as np
import pytest

import patchstore

from conftest import write_exr, write_png


def manifest(tmp_path, field, name):
    (tmp_path / "m.csv").write_text(f"id,{field}\na,{name}\n")
    return tmp_path / "m.csv"


@pytest.mark.parametrize("spec, message", [
    ("affine:2e-46,0", r"SCALE 2e-46 is 0 in float32"),
    ("affine:7e38,0", r"SCALE 7e\+38 is beyond the float32 range"),
    ("affine:1,-9e38", r"OFFSET -9e\+38 is beyond the float32 range"),
])
def test_affine_parameters_beyond_float32_are_refused_before_the_store_exists(tmp_path, cli, spec, message):
    write_png(tmp_path / "a.png", np.full((5, 7, 3), 9, np.uint8))
    m = manifest(tmp_path, "rgb", "a.png")
    with pytest.raises(ValueError, match=message):
        patchstore.ingest_images(tmp_path / "p.ps", manifest=m, norm={"rgb": spec}, progress=False)
    assert not (tmp_path / "p.ps").exists()
    if cli is not None:
        r = subprocess.run([cli, "ingest", "images", str(tmp_path / "c.ps"), "--manifest", str(m), "--norm",
                            f"rgb={spec}"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "float32" in r.stderr, r.stderr
        assert not (tmp_path / "c.ps").exists()


def test_range_wider_than_double_names_the_collapse_not_lo_hi(tmp_path, cli):
    write_png(tmp_path / "a.png", np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3))
    m = manifest(tmp_path, "rgb", "a.png")
    with pytest.raises(ValueError) as e:
        patchstore.ingest_images(tmp_path / "p.ps", manifest=m, norm={"rgb": "range:-1e308,1e308"}, progress=False,
                                 durable=False)
    assert "maps every uint8 value to 0" in str(e.value) and "a.png" in str(e.value), str(e.value)
    assert "LO < HI" not in str(e.value)


def test_uint8_neighbours_collapsing_and_uint16_overflow_are_refused(tmp_path):
    write_png(tmp_path / "a.png", np.full((4, 6), 200, np.uint8))
    with pytest.raises(ValueError, match=r"maps 0 and 1 \(uint8 values\) both to 5e\+08"):
        patchstore.ingest_images(tmp_path / "p.ps", manifest=manifest(tmp_path, "g", "a.png"),
                                 norm={"g": "affine:1,5e8"}, progress=False, durable=False)
    write_png(tmp_path / "b.png", np.full((4, 6), 3, np.uint16))
    with pytest.raises(ValueError, match=r"maps 65535 \(uint16 value\) to inf"):
        patchstore.ingest_images(tmp_path / "q.ps", manifest=manifest(tmp_path, "g", "b.png"),
                                 norm={"g": "affine:2e35,1"}, progress=False, durable=False)


def test_float_images_are_checked_over_their_own_values(tmp_path):
    d = np.linspace(-4, 6e30, 24, dtype=np.float32).reshape(4, 6)
    write_exr(tmp_path / "d.exr", {"Z": d})
    m = manifest(tmp_path, "depth", "d.exr")
    with pytest.raises(ValueError, match=r"d\.exr.*maps 6e\+30 \(float32 value of this file\) to inf"):
        patchstore.ingest_images(tmp_path / "p.ps", manifest=m, norm={"depth": "affine:1e9,0"}, progress=False,
                                 durable=False)
    # The same transform on values it keeps finite is fine.
    write_exr(tmp_path / "d.exr", {"Z": d / np.float32(1e3)})
    s = patchstore.ingest_images(tmp_path / "p.ps", manifest=m, norm={"depth": "affine:1e9,0"}, progress=False,
                                 durable=False)
    assert s.samples_written == 1


def test_hdf5_normalisation_is_checked_for_the_dataset_type(tmp_path):
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("CT/p1", data=np.arange(6 * 5 * 3, dtype=np.int16).reshape(6, 5, 3))
    with pytest.raises(ValueError, match=r"p1.*maps every int16 value to -1"):
        patchstore.ingest_hdf5(tmp_path / "v.h5", tmp_path / "v.ps", groups=["CT"], norm={"CT": "range:0,4e13"},
                               durable=False, progress=False)
