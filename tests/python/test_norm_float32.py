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


def test_hdf5_float_datasets_are_checked_over_their_own_values(tmp_path):
    # The type's extremes say nothing for float sources: each dataset's own finite values are checked,
    # as each float image's are (an HDF5 float32 dataset under affine:6e29,0 stored inf without a word).
    a = np.linspace(-2.5e9, 7e8, 3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    a[2, 3, 4] = np.nan  # not finite in the source: not what overflows
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("CT/p7", data=a)
    with pytest.raises(ValueError, match=r"p7.*'affine:6e29,0' maps -2500000000 \(float32 value of this dataset\) "
                                         r"to -inf"):
        patchstore.ingest_hdf5(tmp_path / "f.h5", tmp_path / "a.ps", groups=["CT"], norm={"CT": "affine:6e29,0"},
                               durable=False, progress=False)
    s = patchstore.ingest_hdf5(tmp_path / "f.h5", tmp_path / "b.ps", groups=["CT"], norm={"CT": "affine:6e25,0"},
                               durable=False, progress=False)
    assert s.samples_written == 1
    v = patchstore.open(tmp_path / "b.ps").volume("p7", "CT")
    assert np.isfinite(v).sum() == a.size - 1 and float(np.nanmin(v)) == pytest.approx(-2.5e9 * 6e25, rel=1e-6)


def test_hdf5_float64_beyond_float32_is_reported_or_refused(tmp_path):
    a = np.full((2, 3, 4), 0.25)
    a[1, 2, 3] = -6.5e41  # float32 holds at most 3.4e38: stored as -inf, as astype(float32) gives, without a word
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("MR/q1", data=a)
    with pytest.warns(RuntimeWarning, match=r"q1.*its float64 value -6\.5e\+41 is beyond float32.*stored as -inf "
                                            r"\(as NumPy's astype\(float32\)\); map the field into float32 with "
                                            r"--norm FIELD=range:LO,HI"):
        s = patchstore.ingest_hdf5(tmp_path / "d.h5", tmp_path / "a.ps", groups=["MR"], durable=False,
                                   progress=False)
    assert len(s.warnings) == 1
    want = np.full((4, 2, 3), 0.25, np.float32)
    want[3, 1, 2] = -np.inf
    np.testing.assert_array_equal(patchstore.open(tmp_path / "a.ps").volume("q1", "MR"), want)
    # A normalisation that leaves it beyond float32 is refused (affine takes the value as float32 first).
    with pytest.raises(ValueError, match=r"'affine:1e-4,0' maps -6\.5e\+41 \(float64 value of this dataset\) to -inf"):
        patchstore.ingest_hdf5(tmp_path / "d.h5", tmp_path / "c.ps", groups=["MR"], norm={"MR": "affine:1e-4,0"},
                               durable=False, progress=False)
    # range:LO,HI is computed in float64: accepted, the extreme at -0.5.
    patchstore.ingest_hdf5(tmp_path / "d.h5", tmp_path / "b.ps", groups=["MR"], norm={"MR": "range:-1.3e42,1.3e42"},
                           durable=False, progress=False)
    v = patchstore.open(tmp_path / "b.ps").volume("q1", "MR")
    assert v.shape == (4, 2, 3) and v[3, 1, 2] == np.float32(-0.5) and np.isfinite(v).all()


def test_hdf5_wide_integers_above_2_24_are_reported(tmp_path):
    with h5py.File(tmp_path / "i.h5", "w") as f:
        a = np.arange(4 * 4 * 2, dtype=np.int64).reshape(4, 4, 2)
        a[1, 2, 1] = -(2**33) - 5
        f.create_dataset("A/v1", data=a)
        f.create_dataset("B/v1", data=np.full((4, 4, 2), 2**24, dtype=np.uint32))  # exact: no note
    with pytest.warns(RuntimeWarning, match=r"dataset 'v1' in group 'A'.*int64 values up to 8589934597 exceed "
                                            r"2\^24") as w:
        s = patchstore.ingest_hdf5(tmp_path / "i.h5", tmp_path / "i.ps", groups=["A", "B"], durable=False,
                                   progress=False)
    assert len(s.warnings) == 1 and "group 'A'" in s.warnings[0], s.warnings
    assert not [x for x in w if "group 'B'" in str(x.message)]
    assert patchstore.open(tmp_path / "i.ps").volume("v1", "A")[1, 1, 2] == np.float32(-(2**33) - 5)
