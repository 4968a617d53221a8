"""Medical volumes in their own formats through ITK (issue 30 items 1-4): `ingest volumes`, the stored
geometry, --orient / --spacing, export to NIfTI / MetaImage, and bad input.

Every input is written here with nibabel or SimpleITK (small volumes); voxels are compared bit for bit
with what SimpleITK / nibabel read from the same file, geometry with their spacing, origin, direction
and affine.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Dict, Tuple

import nibabel as nib
import numpy as np
import pytest

import patchstore

sitk = pytest.importorskip("SimpleITK")

from patchstore import _ingest  # noqa: E402

pytestmark = pytest.mark.skipif(not _ingest.volume_ingest_available(), reason="built without ITK")


def cli_or_skip() -> str:
    c = os.environ.get("PATCHSTORE_CLI") or patchstore.cli_path()
    if not c:
        pytest.skip("patchstore program not found")
    return c


def affine(spacing: Tuple[float, float, float], origin: Tuple[float, float, float], rotate_deg: float = 0.0,
           perm: Tuple[int, int, int] = (0, 1, 2), flips: Tuple[int, int, int] = (1, 1, 1)) -> np.ndarray:
    """A RAS affine: voxel axis c runs along RAS axis perm[c] (sign flips[c]), rotated about S."""
    a = np.zeros((4, 4))
    for c in range(3):
        a[perm[c], c] = flips[c] * spacing[c]
    t = np.deg2rad(rotate_deg)
    rot = np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]])
    a[:3, :3] = rot @ a[:3, :3]
    a[:3, 3] = origin
    a[3, 3] = 1
    return a


def write_nifti(path: Path, data: np.ndarray, aff: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = nib.Nifti1Image(data, aff)
    img.header.set_qform(aff, code=1)
    img.header.set_sform(aff, code=1)
    nib.save(img, str(path))


def cohort(root: Path, rng: np.random.Generator, n: int = 2, shape=(20, 16, 12), ext: str = ".nii.gz",
           aff: np.ndarray = None) -> Dict[str, Dict[str, Path]]:
    """n patients with mr (int16), ct (float32 HU), mask (uint8 labels 0..2) on one grid."""
    aff = affine((0.8, 0.9, 2.5), (-10.0, 20.0, 30.0), rotate_deg=10) if aff is None else aff
    out: Dict[str, Dict[str, Path]] = {}
    for p in range(n):
        pid = f"p{p:02d}"
        d = root / pid
        mr = rng.integers(0, 3000, shape).astype(np.int16)
        ct = rng.uniform(-1024, 3000, shape).astype(np.float32)
        mask = (rng.random(shape) < 0.3).astype(np.uint8) * rng.integers(1, 3, shape).astype(np.uint8)
        paths = {}
        for name, arr in (("mr", mr), ("ct", ct), ("mask", mask)):
            paths[name] = d / f"{name}{ext}"
            write_nifti(paths[name], arr, aff)
        out[pid] = paths
    return out


FIELDS = {"MR": "{patient}/mr.nii.gz", "CT": "{patient}/ct.nii.gz", "MASK": "{patient}/mask.nii.gz"}


def sitk_array(path: Path) -> np.ndarray:
    return sitk.GetArrayFromImage(sitk.ReadImage(str(path)))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def check_geometry_like_sitk(vol: patchstore.Volume, img, atol: float = 1e-5) -> None:
    np.testing.assert_allclose(vol.spacing, img.GetSpacing(), rtol=0, atol=atol)
    np.testing.assert_allclose(vol.origin, img.GetOrigin(), rtol=0, atol=atol)
    np.testing.assert_allclose(vol.direction.ravel(), img.GetDirection(), rtol=0, atol=atol)


# -- 1. ingest, voxels and geometry against both references ------------------------------------------


def test_nifti_cohort_voxels_and_geometry_match_sitk_and_nibabel(tmp_path):
    rng = np.random.default_rng(1)
    files = cohort(tmp_path / "data", rng)
    store = tmp_path / "v.ps"
    s = patchstore.ingest_volumes(store, root=tmp_path / "data", fields=FIELDS, masks=["MASK"],
                                  norm={"MASK": "none"}, progress=False, threads=2)
    assert (s.samples_written, s.samples_failed) == (2, 0)
    st = patchstore.open(store)
    assert st.kind == "volumes" and list(st.ids) == ["p00", "p01"]
    for pid, paths in files.items():
        vol = st.volume(pid)
        assert isinstance(vol, patchstore.Volume)
        for field, name in (("MR", "mr"), ("CT", "ct"), ("MASK", "mask")):
            ref = sitk_array(paths[name])  # (k, j, i): k is the S-I axis here
            assert vol[field].shape == ref.shape == (12, 16, 20)
            assert same_bits(vol[field], ref.astype(np.float32)), field
        img = sitk.ReadImage(str(paths["mr"]))
        check_geometry_like_sitk(vol, img)
        nii = nib.load(str(paths["mr"]))
        np.testing.assert_allclose(vol.affine, nii.affine, rtol=0, atol=1e-4)
        # affine_lps is the same map with x and y negated (ITK's LPS).
        np.testing.assert_allclose(vol.affine_lps, np.diag([-1, -1, 1, 1]) @ vol.affine, rtol=0, atol=1e-12)
        # The qform/sform codes of the NIfTI source are kept.
        assert (vol.geometry["qform_code"], vol.geometry["sform_code"]) == (1, 1)
        assert vol.geometry["reoriented"] is False and vol.geometry["resampled"] is False
        assert vol.geometry["source_size"] == [20, 16, 12]
    # A point check of the convention: element [s, h, w] lies at affine @ (w, h, s, 1) (RAS).
    vol = st.volume("p00")
    nii = nib.load(str(files["p00"]["mr"]))
    w, h, k = 3, 5, 7
    np.testing.assert_allclose(vol.affine @ [w, h, k, 1], nii.affine @ [w, h, k, 1], atol=1e-4)
    assert vol["MR"][k, h, w] == np.asarray(nii.dataobj)[w, h, k]


@pytest.mark.parametrize("ext", [".mha", ".mhd", ".nrrd", ".nhdr"])
def test_metaimage_and_nrrd_inputs(tmp_path, ext):
    rng = np.random.default_rng(2)
    arr = rng.integers(-1000, 2000, (9, 14, 11)).astype(np.int16)  # (k, j, i)
    img = sitk.GetImageFromArray(arr)
    img.SetSpacing((0.7, 1.1, 3.0))
    img.SetOrigin((5.0, -7.5, 12.25))
    c, s = np.cos(0.3), np.sin(0.3)
    img.SetDirection((c, -s, 0, s, c, 0, 0, 0, 1))
    (tmp_path / "d" / "a").mkdir(parents=True)
    sitk.WriteImage(img, str(tmp_path / "d" / "a" / f"ct{ext}"))
    store = tmp_path / "v.ps"
    patchstore.ingest_volumes(store, root=tmp_path / "d", fields={"CT": "{p}/ct" + ext}, progress=False)
    vol = patchstore.open(store).volume("a")
    assert same_bits(vol["CT"], sitk_array(tmp_path / "d" / "a" / f"ct{ext}").astype(np.float32))
    check_geometry_like_sitk(vol, img, atol=1e-9)
    fmt = patchstore.open(store).fields["CT"].source_format
    assert fmt == {".mha": "metaimage", ".mhd": "metaimage", ".nrrd": "nrrd", ".nhdr": "nrrd"}[ext]


def test_slices_follow_anatomy_not_array_order(tmp_path):
    """The SimpleITK/nibabel axis-order trap: a volume whose first array axis runs head to foot is sliced
    along that axis for axial slices, whatever its position in the array."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 1000, (12, 20, 16)).astype(np.int16)  # nibabel (i, j, k)
    # i runs towards Superior, j towards Anterior, k towards Right: a sagittal-first layout.
    aff = affine((2.0, 0.9, 0.8), (0.0, 0.0, 0.0), perm=(2, 1, 0))
    write_nifti(tmp_path / "d" / "x" / "mr.nii.gz", data, aff)
    store = tmp_path / "v.ps"
    patchstore.ingest_volumes(store, root=tmp_path / "d", fields={"MR": "{p}/mr.nii.gz"}, progress=False)
    vol = patchstore.open(store).volume("x")
    ref = sitk_array(tmp_path / "d" / "x" / "mr.nii.gz")  # (k, j, i) = (16, 20, 12)
    assert ref.shape == (16, 20, 12)
    # Axial: S is image axis i (12 slices); H, W are k and j (array order).
    assert vol["MR"].shape == (12, 16, 20)
    assert same_bits(vol["MR"], ref.transpose(2, 0, 1).astype(np.float32))
    # Each stored slice is one axial plane: constant S-I coordinate (RAS z) over the slice.
    z = [(vol.affine @ [w, h, 5, 1])[2] for w in (0, 19) for h in (0, 15)]
    np.testing.assert_allclose(z, z[0], atol=1e-6)
    # Sagittal slices of the same file: along k (the L-R axis).
    store2 = tmp_path / "v2.ps"
    patchstore.ingest_volumes(store2, root=tmp_path / "d", fields={"MR": "{p}/mr.nii.gz"}, slice_axis="sagittal",
                              progress=False)
    assert patchstore.open(store2).volume("x")["MR"].shape == (16, 20, 12)


# -- 2. --orient and --spacing ------------------------------------------------------------------------


def test_orient_ras_matches_nibabel_canonical(tmp_path):
    rng = np.random.default_rng(4)
    data = rng.integers(0, 1000, (10, 14, 8)).astype(np.int16)
    aff = affine((1.0, 1.5, 2.0), (3.0, -4.0, 5.0), perm=(1, 0, 2), flips=(-1, 1, -1))
    write_nifti(tmp_path / "d" / "x" / "mr.nii.gz", data, aff)
    store = tmp_path / "v.ps"
    patchstore.ingest_volumes(store, root=tmp_path / "d", fields={"MR": "{p}/mr.nii.gz"}, orient="RAS",
                              progress=False)
    vol = patchstore.open(store).volume("x")
    canon = nib.as_closest_canonical(nib.load(str(tmp_path / "d" / "x" / "mr.nii.gz")))
    assert nib.aff2axcodes(canon.affine) == ("R", "A", "S")
    want = np.asarray(canon.dataobj).transpose(2, 1, 0)  # (i, j, k) RAS -> (S, H, W)
    assert same_bits(vol["MR"], want.astype(np.float32))
    np.testing.assert_allclose(vol.affine, canon.affine, rtol=0, atol=1e-4)
    assert vol.geometry["reoriented"] is True
    # LPS: ITK's identity orientation.
    store2 = tmp_path / "v2.ps"
    patchstore.ingest_volumes(store2, root=tmp_path / "d", fields={"MR": "{p}/mr.nii.gz"}, orient="LPS",
                              progress=False)
    v2 = patchstore.open(store2).volume("x")
    np.testing.assert_allclose(v2.direction, np.eye(3), atol=1e-6)
    ref = sitk.DICOMOrient(sitk.ReadImage(str(tmp_path / "d" / "x" / "mr.nii.gz")), "LPS")
    assert same_bits(v2["MR"], sitk.GetArrayFromImage(ref).astype(np.float32))
    check_geometry_like_sitk(v2, ref)


def test_spacing_resamples_linear_images_and_nearest_masks_like_sitk(tmp_path):
    rng = np.random.default_rng(5)
    files = cohort(tmp_path / "data", rng, n=1, aff=affine((0.8, 0.9, 2.5), (1.0, 2.0, 3.0)))
    store = tmp_path / "v.ps"
    patchstore.ingest_volumes(store, root=tmp_path / "data", fields=FIELDS, masks=["MASK"], norm={"MASK": "none"},
                              spacing=(1.0, 1.2, 2.0), progress=False)
    st = patchstore.open(store)
    vol = st.volume("p00")
    src = sitk.ReadImage(str(files["p00"]["mr"]))
    size = [int(round(n * s / t)) for n, s, t in zip(src.GetSize(), src.GetSpacing(), (1.0, 1.2, 2.0))]
    assert vol["MR"].shape == (size[2], size[1], size[0])
    assert vol.spacing == (1.0, 1.2, 2.0)
    assert vol.geometry["resampled"] is True
    np.testing.assert_allclose(vol.geometry["source_spacing"], src.GetSpacing(), atol=1e-6)

    def resample(path: Path, interp) -> np.ndarray:
        img = sitk.ReadImage(str(path))
        if interp == sitk.sitkLinear:
            img = sitk.Cast(img, sitk.sitkFloat32)
        out = sitk.Resample(img, size, sitk.Transform(), interp, img.GetOrigin(), (1.0, 1.2, 2.0),
                            img.GetDirection(), 0)
        return sitk.GetArrayFromImage(out)

    np.testing.assert_allclose(vol["MR"], resample(files["p00"]["mr"], sitk.sitkLinear), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(vol["CT"], resample(files["p00"]["ct"], sitk.sitkLinear), rtol=1e-5, atol=1e-3)
    # Labels stay labels: nearest neighbour, the same voxels as SimpleITK's.
    mask = resample(files["p00"]["mask"], sitk.sitkNearestNeighbor)
    assert set(np.unique(vol["MASK"])) <= {0.0, 1.0, 2.0}
    assert np.mean(vol["MASK"] == mask) > 0.999
    assert st.fields["MR"].source_type == "float32"  # linear interpolation gives float values
    assert st.fields["MASK"].source_type == "uint8"


def test_origins_that_differ_by_float32_header_precision_are_one_grid(tmp_path):
    # Two writers' float32 headers of one grid: origins 1.5e-5 mm apart at -117.3 mm (about 2 float32 steps) are the
    # same grid; 0.004 mm apart is not, and the message shows the digits that differ, in LPS.
    rng = np.random.default_rng(21)
    mr = rng.integers(0, 900, (12, 10, 4)).astype(np.int16)
    for name, shift in (("same", 1.5e-5), ("apart", 4e-3)):
        d = tmp_path / name / "p"
        write_nifti(d / "mr.nii.gz", mr, affine((0.9, 0.9, 2.5), (-90.25, -117.3, 41.0)))
        write_nifti(d / "ct.nii.gz", mr + 7, affine((0.9, 0.9, 2.5), (-90.25, -117.3 + shift, 41.0)))
    fields = {"MR": "{p}/mr.nii.gz", "CT": "{p}/ct.nii.gz"}
    patchstore.ingest_volumes(tmp_path / "s.ps", root=tmp_path / "same", fields=fields, progress=False)
    assert np.array_equal(patchstore.open(tmp_path / "s.ps").volume("p")["CT"], (mr + 7).transpose(2, 1, 0))
    with pytest.raises(ValueError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "apart", fields=fields, progress=False)
    # LPS: RAS (-90.25, -117.3) is (90.25, 117.3); the header's float32 gives 117.300003.
    assert "origin (90.25, 117.300003, 41) vs (90.25, 117.295998, 41) (LPS, mm)" in str(e.value), str(e.value)


def test_fields_on_different_grids_are_refused_unless_resampled(tmp_path):
    rng = np.random.default_rng(6)
    d = tmp_path / "d" / "x"
    write_nifti(d / "mr.nii.gz", rng.integers(0, 100, (10, 10, 6)).astype(np.int16), affine((1, 1, 2), (0, 0, 0)))
    write_nifti(d / "ct.nii.gz", rng.integers(0, 100, (10, 10, 6)).astype(np.int16), affine((1, 1, 2.5), (0, 0, 0)))
    fields = {"MR": "{p}/mr.nii.gz", "CT": "{p}/ct.nii.gz"}
    with pytest.raises(ValueError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields=fields, progress=False)
    msg = str(e.value)
    # The first field's grid first: MR's spacing, then CT's.
    assert "field 'CT'" in msg and "another grid than field 'MR'" in msg, msg
    assert "spacing (1, 1, 2) vs (1, 1, 2.5)" in msg, msg
    assert "--spacing" in msg
    s = patchstore.ingest_volumes(tmp_path / "b.ps", root=tmp_path / "d", fields=fields, spacing=(1, 1, 2),
                                  progress=False)
    assert s.samples_written == 1
    vol = patchstore.open(tmp_path / "b.ps").volume("x")
    assert vol["MR"].shape == vol["CT"].shape == (6, 10, 10)


# -- 3. export with the geometry ----------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["float32", "compact"])
def test_export_nifti_and_mha_round_trip(tmp_path, encoding):
    rng = np.random.default_rng(7)
    cohort(tmp_path / "data", rng, n=1)
    store = tmp_path / "v.ps"
    patchstore.ingest_volumes(store, root=tmp_path / "data", fields=FIELDS, masks=["MASK"],
                              norm={"CT": "range:-1024,3000"}, encoding=encoding, progress=False)
    st = patchstore.open(store)
    vol = st.volume("p00")
    for fmt, ext in (("nifti", ".nii.gz"), ("mha", ".mha")):
        out = tmp_path / f"out-{fmt}"
        patchstore.export(store, out, format=fmt)
        for field in ("MR", "CT", "MASK"):
            path = out / "p00" / f"{field}{ext}"
            back = sitk.ReadImage(str(path))
            assert back.GetPixelID() == sitk.sitkFloat32
            assert same_bits(sitk.GetArrayFromImage(back), vol[field]), (fmt, field)
            check_geometry_like_sitk(vol, back, atol=1e-5 if fmt == "nifti" else 1e-12)
            if fmt == "nifti":
                nii = nib.load(str(path))
                np.testing.assert_allclose(nii.affine, vol.affine, rtol=0, atol=1e-4)
                assert same_bits(np.asarray(nii.dataobj).transpose(2, 1, 0), vol[field])


# -- 4. DICOM series ----------------------------------------------------------------------------------


def write_dicom_series(folder: Path, arr: np.ndarray, uid: str, number: int, description: str,
                       spacing=(0.6, 0.6, 2.0), origin=(-50.0, -60.0, 10.0)) -> sitk.Image:
    folder.mkdir(parents=True, exist_ok=True)
    img = sitk.GetImageFromArray(arr)
    img.SetSpacing(spacing)
    img.SetOrigin(origin)
    writer = sitk.ImageFileWriter()
    writer.KeepOriginalImageUIDOn()
    d = img.GetDirection()
    tags = [("0008|0021", "20240101"), ("0008|0031", "120000"), ("0008|0060", "CT"),
            ("0020|000d", "1.2.826.0.1.3680043.2.1125.1"), ("0020|000e", uid), ("0020|0011", str(number)),
            ("0008|103e", description),
            ("0020|0037", "\\".join(map(str, (d[0], d[3], d[6], d[1], d[4], d[7]))))]
    for k in range(img.GetDepth()):
        sl = img[:, :, k]
        for t, v in tags:
            sl.SetMetaData(t, v)
        sl.SetMetaData("0020|0032", "\\".join(map(str, img.TransformIndexToPhysicalPoint((0, 0, k)))))
        sl.SetMetaData("0020|0013", str(k + 1))
        sl.SetMetaData("0008|0018", f"{uid}.{k + 1}")
        writer.SetFileName(str(folder / f"{number}-{k:03d}.dcm"))
        writer.Execute(sl)
    return img


def test_dicom_series_folder(tmp_path):
    rng = np.random.default_rng(8)
    arr = rng.integers(-1000, 2000, (7, 12, 10)).astype(np.int16)
    img = write_dicom_series(tmp_path / "d" / "x" / "ct", arr, "1.2.3.4.5.1", 3, "axial CT")
    store = tmp_path / "v.ps"
    patchstore.ingest_volumes(store, root=tmp_path / "d", fields={"CT": "{p}/ct"}, progress=False)
    vol = patchstore.open(store).volume("x")
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(sitk.ImageSeriesReader.GetGDCMSeriesFileNames(str(tmp_path / "d" / "x" / "ct")))
    ref = reader.Execute()
    assert same_bits(vol["CT"], sitk.GetArrayFromImage(ref).astype(np.float32))
    assert same_bits(vol["CT"], arr.astype(np.float32))
    check_geometry_like_sitk(vol, img, atol=1e-4)
    assert patchstore.open(store).fields["CT"].source_format == "dicom"


def test_dicom_two_series_refused_naming_them_or_picked(tmp_path):
    rng = np.random.default_rng(9)
    a = rng.integers(0, 100, (4, 8, 8)).astype(np.int16)
    b = rng.integers(0, 100, (5, 8, 8)).astype(np.int16)
    folder = tmp_path / "d" / "x" / "ct"
    write_dicom_series(folder, a, "1.2.3.4.5.1", 3, "first")
    write_dicom_series(folder, b, "1.2.3.4.5.2", 4, "second")
    with pytest.raises(ValueError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"CT": "{p}/ct"}, progress=False)
    msg = str(e.value)
    assert "holds 2 series" in msg and "'1.2.3.4.5.1'" in msg and "'1.2.3.4.5.2'" in msg and "--series" in msg, msg
    assert '"second"' in msg and "5 files" in msg
    patchstore.ingest_volumes(tmp_path / "b.ps", root=tmp_path / "d", fields={"CT": "{p}/ct"}, series="1.2.3.4.5.2",
                              progress=False)
    assert same_bits(patchstore.open(tmp_path / "b.ps").volume("x")["CT"], b.astype(np.float32))
    patchstore.ingest_volumes(tmp_path / "c.ps", root=tmp_path / "d", fields={"CT": "{p}/ct"}, series="3",
                              progress=False)  # by series number
    assert same_bits(patchstore.open(tmp_path / "c.ps").volume("x")["CT"], a.astype(np.float32))


def test_dicom_missing_slice_is_refused(tmp_path):
    rng = np.random.default_rng(10)
    folder = tmp_path / "d" / "x" / "ct"
    write_dicom_series(folder, rng.integers(0, 100, (6, 8, 8)).astype(np.int16), "1.2.3.9", 1, "ct")
    os.remove(folder / "1-003.dcm")
    with pytest.raises(ValueError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"CT": "{p}/ct"}, progress=False)
    msg = str(e.value)
    assert "jump by 4 mm" in msg and "1-002.dcm" in msg and "1-004.dcm" in msg and "missing slice" in msg, msg


# -- 5. bad input ---------------------------------------------------------------------------------------


def test_truncated_nifti_fails_that_volume_only(tmp_path):
    rng = np.random.default_rng(11)
    files = cohort(tmp_path / "data", rng, n=2)
    raw = files["p00"]["ct"].read_bytes()
    files["p00"]["ct"].write_bytes(raw[: len(raw) // 2])
    with pytest.raises(OSError) as e:  # CorruptRecordError
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "data", fields=FIELDS, progress=False)
    assert "ct.nii.gz" in str(e.value) and "field 'CT'" in str(e.value)
    s = patchstore.ingest_volumes(tmp_path / "b.ps", root=tmp_path / "data", fields=FIELDS, on_error="skip",
                                  progress=False)
    assert (s.samples_written, s.samples_failed) == (1, 1)
    report = Path(s.report_path).read_text().splitlines()
    assert len(report) == 1 and report[0].startswith("p00\t") and "ct.nii.gz" in report[0]
    assert list(patchstore.open(tmp_path / "b.ps").ids) == ["p01"]


@pytest.mark.parametrize("ext,compress", [(".mha", False), (".mha", True), (".mhd", False), (".nrrd", False),
                                          (".nrrd", True), (".nii", False)])
def test_truncated_metaimage_nrrd_and_nifti_are_refused(tmp_path, ext, compress):
    """ITK 5.2 reads a short MetaImage or NIfTI file without an error (zeros for what is missing): ingest checks
    the bytes against the header first."""
    arr = np.random.default_rng(20).integers(-1000, 2000, (20, 32, 32)).astype(np.int16)
    d = tmp_path / "d" / "x"
    d.mkdir(parents=True)
    sitk.WriteImage(sitk.GetImageFromArray(arr), str(d / f"v{ext}"), useCompression=compress)
    target = d / ("v.raw" if ext == ".mhd" else f"v{ext}")
    raw = target.read_bytes()
    target.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(OSError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"V": "{p}/v" + ext}, progress=False)
    assert f"v{ext}" in str(e.value), str(e.value)
    assert "truncated" in str(e.value) or "expected" in str(e.value) or "fread" in str(e.value), str(e.value)


@pytest.mark.parametrize("dtype,slope,inter,ext", [
    (np.int16, 0.5, -10.0, ".nii"), (np.int16, 0.5, -10.0, ".nii.gz"),
    (np.int16, 0.1, 0.3, ".nii.gz"),  # values no float32 holds exactly
    (np.uint8, 2.5, 3.0, ".nii"), (np.int32, 0.37, -1.5, ".nii.gz"), (np.uint16, -4.0, 7.25, ".nii")])
def test_nifti_with_scl_slope_is_read_scaled_as_float32(tmp_path, dtype, slope, inter, ext):
    """ITK reads an integer NIfTI with scl_slope / scl_inter as float32 raw * slope + inter: the truncation check
    counts the voxels as stored (2 bytes for int16, not float32's 4), and the stored values are SimpleITK's and
    nibabel's, recorded as a float32 source."""
    info = np.iinfo(dtype)
    raw = np.random.default_rng(21).integers(max(info.min, -30000), min(info.max, 30000), (10, 12, 8),
                                             endpoint=True).astype(dtype)
    path = tmp_path / "d" / "x" / f"v{ext}"
    path.parent.mkdir(parents=True)
    img = nib.Nifti1Image(raw, affine((1.0, 1.5, 2.0), (0, 0, 0)))
    img.header.set_slope_inter(slope, inter)
    nib.save(img, str(path))
    s = patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"V": "{p}/v" + ext},
                                  progress=False)
    assert (s.samples_written, s.warnings) == (1, [])
    st = patchstore.open(tmp_path / "a.ps")
    assert st.fields["V"].source_type == "float32"
    got = st.volume("x")["V"]
    assert same_bits(got, sitk_array(path))
    nib_values = np.asanyarray(nib.load(str(path)).dataobj).transpose(2, 1, 0).astype(np.float32)
    assert same_bits(got, nib_values)
    assert not same_bits(got, raw.transpose(2, 1, 0))  # scaled, not the raw integers


def one_nifti(root: Path, data: np.ndarray, name: str = "v.nii.gz") -> Path:
    path = root / "x" / name
    path.parent.mkdir(parents=True)
    nib.save(nib.Nifti1Image(data, affine((1.0, 1.0, 2.0), (0, 0, 0)), dtype=data.dtype), str(path))
    return path


def test_float64_nifti_beyond_float32_is_reported_and_norms_run_as_for_hdf5(tmp_path):
    """The checks of `ingest hdf5` (one VolumeValueCheck): a float64 value float32 records cannot hold is stored as
    +-inf with a warning; a --norm is checked on the volume's values; range:LO,HI is computed in float64."""
    a = np.random.default_rng(22).uniform(-3, 3, (6, 5, 4))
    a[1, 2, 3] = -7.5e40
    a[4, 0, 1] = 2.5e39
    path = one_nifti(tmp_path / "d", a)
    fields = {"V": "{p}/v.nii.gz"}
    with pytest.warns(RuntimeWarning, match=r"field 'V' \('.*v\.nii\.gz'\): its float64 value -7\.5e\+40 is beyond "
                                            r"float32 .*stored as -inf \(as NumPy's astype\(float32\)\); map the field "
                                            r"into float32 with --norm FIELD=range:LO,HI"):
        s = patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields=fields, progress=False)
    assert len(s.warnings) == 1, s.warnings  # once per volume
    st = patchstore.open(tmp_path / "a.ps")
    assert st.fields["V"].source_type == "float64"
    got = st.volume("x")["V"]
    with np.errstate(over="ignore"):
        want, sitk_want = a.transpose(2, 1, 0).astype(np.float32), sitk_array(path).astype(np.float32)
    assert got[3, 2, 1] == -np.inf and got[1, 0, 4] == np.inf and same_bits(got, want)
    assert same_bits(got, sitk_want)
    # affine takes the value as float32 first: refused, naming the value.
    with pytest.raises(ValueError, match=r"v\.nii\.gz.*'affine:1e-4,0' maps -7\.5e\+40 \(float64 value of this "
                                         r"volume\) to -inf"):
        patchstore.ingest_volumes(tmp_path / "b.ps", root=tmp_path / "d", fields=fields, norm={"V": "affine:1e-4,0"},
                                  progress=False)
    # range:LO,HI in float64: finite, without a warning, (x - mid) / half as NumPy computes it in float64.
    s = patchstore.ingest_volumes(tmp_path / "c.ps", root=tmp_path / "d", fields=fields,
                                  norm={"V": "range:-1e41,1e41"}, progress=False)
    assert s.warnings == []
    got = patchstore.open(tmp_path / "c.ps").volume("x")["V"]
    assert np.isfinite(got).all() and got[3, 2, 1] == np.float32(-0.75)
    assert same_bits(got, ((a - 0.0) / 1e41).transpose(2, 1, 0).astype(np.float32))
    # Within float32: no warning, the values astype(float32) gives.
    b = np.random.default_rng(23).uniform(-3e38, 3e38, (6, 5, 4))
    one_nifti(tmp_path / "e", b)
    s = patchstore.ingest_volumes(tmp_path / "e.ps", root=tmp_path / "e", fields=fields, progress=False)
    assert s.warnings == []
    assert same_bits(patchstore.open(tmp_path / "e.ps").volume("x")["V"], b.transpose(2, 1, 0).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.uint32, np.int32, np.int64, np.uint64])
def test_wide_integer_nifti_above_2_24_is_reported(tmp_path, dtype):
    """float32 rounds 32/64-bit integers above 2^24: said once per volume as `ingest hdf5` says it; 64-bit
    integers keep their source type (they were read through float64 before)."""
    a = np.arange(6 * 5 * 4, dtype=dtype).reshape(6, 5, 4)
    big = (2**24 + 3) if dtype in (np.uint32, np.int32) else (2**40 + 7)
    a[2, 3, 1] = big
    if dtype in (np.int32, np.int64):
        a[0, 0, 0] = -big - 2
    one_nifti(tmp_path / "d", a, "v.nii")
    name = np.dtype(dtype).name
    largest = big + 2 if dtype in (np.int32, np.int64) else big
    with pytest.warns(RuntimeWarning, match=rf"field 'V' \('.*v\.nii'\): {name} values up to {largest} exceed "
                                            r"2\^24 = 16777216 and are rounded to the nearest float32"):
        s = patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"V": "{p}/v.nii"},
                                      progress=False)
    assert len(s.warnings) == 1, s.warnings
    st = patchstore.open(tmp_path / "a.ps")
    assert st.fields["V"].source_type == name
    assert same_bits(st.volume("x")["V"], a.transpose(2, 1, 0).astype(np.float32))
    # Up to 2^24 every value is exact: no warning.
    b = np.arange(6 * 5 * 4, dtype=dtype).reshape(6, 5, 4)
    b[2, 3, 1] = 2**24
    one_nifti(tmp_path / "e", b, "v.nii")
    s = patchstore.ingest_volumes(tmp_path / "e.ps", root=tmp_path / "e", fields={"V": "{p}/v.nii"}, progress=False)
    assert s.warnings == []
    got = patchstore.open(tmp_path / "e.ps").volume("x")["V"]
    assert got[1, 3, 2] == 2**24 and np.array_equal(got.astype(np.int64), b.transpose(2, 1, 0).astype(np.int64))


def test_four_d_refused_or_picked(tmp_path):
    rng = np.random.default_rng(12)
    data = rng.integers(0, 100, (8, 6, 5, 3)).astype(np.int16)
    write_nifti(tmp_path / "d" / "x" / "bold.nii.gz", data, affine((2, 2, 3), (0, 0, 0)))
    fields = {"BOLD": "{p}/bold.nii.gz"}
    with pytest.raises(ValueError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields=fields, progress=False)
    assert "4-D image (8x6x5x3)" in str(e.value) and "--volume-index" in str(e.value)
    patchstore.ingest_volumes(tmp_path / "b.ps", root=tmp_path / "d", fields=fields, volume_index=1, progress=False)
    vol = patchstore.open(tmp_path / "b.ps").volume("x")
    assert same_bits(vol["BOLD"], data[..., 1].transpose(2, 1, 0).astype(np.float32))
    with pytest.raises(ValueError, match="beyond its 3 volumes"):
        patchstore.ingest_volumes(tmp_path / "c.ps", root=tmp_path / "d", fields=fields, volume_index=3,
                                  progress=False)
    # A cohort mixing 3-D and 4-D files: --volume-index picks in the 4-D ones, the 3-D ones are read whole.
    three = rng.integers(0, 100, (8, 6, 5)).astype(np.int16)
    write_nifti(tmp_path / "d" / "y" / "bold.nii.gz", three, affine((2, 2, 3), (0, 0, 0)))
    patchstore.ingest_volumes(tmp_path / "m.ps", root=tmp_path / "d", fields=fields, volume_index=2, progress=False)
    m = patchstore.open(tmp_path / "m.ps")
    assert same_bits(m.volume("x")["BOLD"], data[..., 2].transpose(2, 1, 0).astype(np.float32))
    assert same_bits(m.volume("y")["BOLD"], three.transpose(2, 1, 0).astype(np.float32))


def write_mha(path: Path, header: Dict[str, str], payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{k} = {v}\n" for k, v in header.items()) + "ElementDataFile = LOCAL\n"
    path.write_bytes(text.encode() + payload)


MHA = {"ObjectType": "Image", "NDims": "3", "BinaryData": "True", "BinaryDataByteOrderMSB": "False",
       "CompressedData": "False", "TransformMatrix": "1 0 0 0 1 0 0 0 1", "Offset": "0 0 0",
       "ElementSpacing": "1 1 1", "DimSize": "4 4 4", "ElementType": "MET_SHORT"}


def test_sheared_direction_and_bad_spacing_refused(tmp_path):
    payload = np.arange(64, dtype=np.int16).tobytes()
    write_mha(tmp_path / "a" / "x" / "v.mha", dict(MHA, TransformMatrix="1 0.3 0 0 1 0 0 0 1"), payload)
    with pytest.raises(ValueError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "a", fields={"V": "{p}/v.mha"}, progress=False)
    assert "v.mha" in str(e.value) and "not orthonormal" in str(e.value), str(e.value)
    write_mha(tmp_path / "b" / "x" / "v.mha", dict(MHA, ElementSpacing="1 0 1"), payload)
    with pytest.raises((ValueError, OSError)) as e:
        patchstore.ingest_volumes(tmp_path / "b.ps", root=tmp_path / "b", fields={"V": "{p}/v.mha"}, progress=False)
    assert "v.mha" in str(e.value) and "spacing" in str(e.value).lower(), str(e.value)
    # NaN voxel size in a NIfTI header without qform/sform (spacing from pixdim).
    img = nib.Nifti1Image(np.zeros((4, 4, 4), np.int16), None)
    img.header["pixdim"][1:4] = [1.0, np.nan, 1.0]
    (tmp_path / "c" / "x").mkdir(parents=True)
    nib.save(img, str(tmp_path / "c" / "x" / "v.nii"))
    with pytest.raises((ValueError, OSError)) as e:
        patchstore.ingest_volumes(tmp_path / "c.ps", root=tmp_path / "c", fields={"V": "{p}/v.nii"}, progress=False)
    assert "v.nii" in str(e.value) and "spacing" in str(e.value).lower(), str(e.value)
    for name in ("a.ps", "b.ps", "c.ps"):
        assert not (tmp_path / name / "data.mdb").exists() or len(patchstore.open(tmp_path / name)) == 0


@pytest.mark.parametrize("bad", [np.nan, -2.0, 0.0])
@pytest.mark.parametrize("codes", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_bad_nifti_pixdim_is_named_whatever_the_xform_codes(tmp_path, bad, codes):
    """A NaN, negative or zero pixdim is refused naming pixdim, also when an sform is set (where ITK would say
    only "orthonormal direction cosines")."""
    aff = affine((2.0, 3.0, 4.0), (1, 2, 3))
    img = nib.Nifti1Image(np.ones((6, 5, 4), np.float32), aff)
    img.header.set_qform(aff, code=codes[0])
    img.header.set_sform(aff, code=codes[1])
    (tmp_path / "d" / "x").mkdir(parents=True)
    path = tmp_path / "d" / "x" / "v.nii"
    nib.save(img, str(path))
    raw = bytearray(path.read_bytes())
    raw[84:88] = np.float32(bad).tobytes()  # pixdim[2] (nibabel would rewrite it from the affine on save)
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"V": "{p}/v.nii"}, progress=False)
    assert f"'{path}': its header gives voxel size pixdim (2, {bad:g}, 4)" in str(e.value), str(e.value)


def test_gigantic_header_is_refused_before_reading(tmp_path):
    hdr = nib.Nifti1Header()
    hdr.set_data_dtype(np.float32)
    hdr.set_data_shape((30000, 30000, 30000))
    hdr["vox_offset"] = 352
    (tmp_path / "d" / "x").mkdir(parents=True)
    (tmp_path / "d" / "x" / "v.nii").write_bytes(hdr.binaryblock + b"\0" * 4 + b"\0" * 4096)
    with pytest.raises(ValueError) as e:
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"V": "{p}/v.nii"}, progress=False)
    assert "30000x30000x30000" in str(e.value) and "refused before reading" in str(e.value), str(e.value)


def test_hostile_volume_does_not_take_down_the_ingest(tmp_path):
    """A header declaring 1.2 GB of float64 voxels with a few bytes behind it: the decoder process
    allocates and fails (or dies); the other patient is ingested and the failure reported."""
    rng = np.random.default_rng(13)
    ok = tmp_path / "d" / "ok"
    write_nifti(ok / "v.nii", rng.integers(0, 100, (6, 6, 4)).astype(np.int16), affine((1, 1, 1), (0, 0, 0)))
    hdr = nib.Nifti1Header()
    hdr.set_data_dtype(np.float64)
    hdr.set_data_shape((600, 600, 400))
    hdr["vox_offset"] = 352
    (tmp_path / "d" / "bad").mkdir(parents=True)
    (tmp_path / "d" / "bad" / "v.nii").write_bytes(hdr.binaryblock + b"\0" * 4 + b"\1" * 65536)
    s = patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"V": "{p}/v.nii"},
                                  on_error="skip", progress=False, threads=1)
    assert (s.samples_written, s.samples_failed) == (1, 1)
    assert "bad/v.nii" in s.errors[0]
    assert list(patchstore.open(tmp_path / "a.ps").ids) == ["ok"]


def test_decoder_over_its_memory_limit_fails_that_volume_only(tmp_path):
    """A valid volume that needs more memory than the decoder process may take: that volume fails with
    a message naming its file, the ingest goes on in a fresh decoder."""
    rng = np.random.default_rng(17)
    write_nifti(tmp_path / "d" / "big" / "v.nii", rng.random((160, 160, 160)), affine((1, 1, 1), (0, 0, 0)))
    write_nifti(tmp_path / "d" / "small" / "v.nii", rng.random((6, 6, 4)), affine((1, 1, 1), (0, 0, 0)))
    s = patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"V": "{p}/v.nii"},
                                  on_error="skip", decode_memory=16 << 20, threads=1, progress=False)
    assert (s.samples_written, s.samples_failed) == (1, 1), s.errors
    assert "big/v.nii" in s.errors[0] and "field 'V'" in s.errors[0], s.errors
    assert list(patchstore.open(tmp_path / "a.ps").ids) == ["small"]


def test_manifest_and_shards(tmp_path):
    rng = np.random.default_rng(18)
    files = cohort(tmp_path / "data", rng, n=4, shape=(8, 6, 4))
    folder = tmp_path / "dicom" / "ct"
    arr = rng.integers(0, 100, (4, 6, 8)).astype(np.int16)
    write_dicom_series(folder, arr, "1.2.3.77", 1, "ct", spacing=(0.8, 0.9, 2.5))
    lines = ["id,MR,MASK"] + [f"{pid},data/{pid}/mr.nii.gz,data/{pid}/mask.nii.gz" for pid in files]
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    s = patchstore.ingest_volumes(tmp_path / "m.ps", manifest=tmp_path / "m.csv", masks=["MASK"], progress=False)
    assert s.samples_written == 4
    st = patchstore.open(tmp_path / "m.ps")
    assert same_bits(st.volume("p02")["MR"], sitk_array(files["p02"]["mr"]).astype(np.float32))
    assert set(np.unique(st.volume("p02")["MASK"])) <= {0.0, 1.0}  # --mask: binary by default
    # A manifest cell may name a DICOM folder.
    (tmp_path / "d.csv").write_text("id,CT\nx,dicom/ct\n")
    patchstore.ingest_volumes(tmp_path / "d.ps", manifest=tmp_path / "d.csv", progress=False)
    assert same_bits(patchstore.open(tmp_path / "d.ps").volume("x")["CT"], arr.astype(np.float32))
    # Shards: every volume in exactly one shard, with its geometry; the set reads as the whole.
    for i in range(2):
        patchstore.ingest_volumes(tmp_path / f"s{i}.ps", manifest=tmp_path / "m.csv", masks=["MASK"], shard=(i, 2),
                                  progress=False)
    parts = [list(patchstore.open(tmp_path / f"s{i}.ps").ids) for i in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(files)
    both = patchstore.open([tmp_path / "s0.ps", tmp_path / "s1.ps"])
    for pid in files:
        np.testing.assert_array_equal(both.volume(pid).affine, st.volume(pid).affine)


def test_max_voxels_and_unknown_format(tmp_path):
    rng = np.random.default_rng(14)
    write_nifti(tmp_path / "d" / "x" / "v.nii.gz", rng.integers(0, 9, (10, 10, 10)).astype(np.int16),
                affine((1, 1, 1), (0, 0, 0)))
    with pytest.raises(ValueError, match="more than the limit of 999"):
        patchstore.ingest_volumes(tmp_path / "a.ps", root=tmp_path / "d", fields={"V": "{p}/v.nii.gz"},
                                  max_voxels=999, progress=False)
    (tmp_path / "e" / "x").mkdir(parents=True)
    (tmp_path / "e" / "x" / "v.png").write_bytes(b"\x89PNG")
    with pytest.raises(Exception, match="unknown volume format"):
        patchstore.ingest_volumes(tmp_path / "b.ps", root=tmp_path / "e", fields={"V": "{p}/v.png"}, progress=False)


# -- 6. the command line: ingest, info --all, ls --json, export, resume --------------------------------


def test_cli_ingest_info_ls_export_and_resume(tmp_path):
    cli = cli_or_skip()
    rng = np.random.default_rng(15)
    files = cohort(tmp_path / "data", rng, n=2)
    store = str(tmp_path / "v.ps")
    cmd = [cli, "-q", "ingest", "volumes", store, "--root", str(tmp_path / "data"), "--field", "MR={patient}/mr.nii.gz",
           "--field", "CT={patient}/ct.nii.gz", "--field", "MASK={patient}/mask.nii.gz", "--mask", "MASK", "--orient",
           "LPS"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ingested 2 new volumes" in r.stdout and "store sealed" in r.stdout
    r = subprocess.run(cmd, capture_output=True, text=True)  # resume: nothing to do
    assert r.returncode == 0 and "all 2 volumes already in" in r.stdout and "nothing to do" in r.stdout, r.stdout
    assert "0/0" not in r.stderr and "projected" not in r.stderr, r.stderr
    # The same store with another --orient is refused, naming both settings.
    r = subprocess.run(cmd[:-1] + ["RAS"], capture_output=True, text=True)
    assert r.returncode != 0 and "--orient" in r.stderr and "LPS" in r.stderr and "RAS" in r.stderr, r.stderr
    info = subprocess.run([cli, "info", store, "--all"], capture_output=True, text=True, check=True).stdout
    assert "p00: MR 12x16x20, CT 12x16x20, MASK 12x16x20; spacing 0.8x0.9x2.5 mm" in info, info
    assert "axes LPS (W,H,S)" in info and "reoriented" in info
    ls = json.loads(subprocess.run([cli, "ls", store, "--json"], capture_output=True, text=True, check=True).stdout)
    g = ls[0]["geometry"]
    vol = patchstore.open(store).volume("p00")
    assert g["spacing"] == list(vol.spacing) and g["origin"] == list(vol.origin)
    assert np.array_equal(np.array(g["affine_ras"]).reshape(4, 4), vol.affine)
    assert g["axes"] == "LPS" and g["reoriented"] is True
    ref = sitk.DICOMOrient(sitk.ReadImage(str(files["p00"]["mr"])), "LPS")
    check_geometry_like_sitk(vol, ref)
    info_json = json.loads(subprocess.run([cli, "info", store, "--all", "--json"], capture_output=True, text=True,
                                          check=True).stdout)
    assert info_json["sample_shapes"][1]["geometry"]["spacing"] == list(patchstore.open(store).volume("p01").spacing)
    out = tmp_path / "out"
    r = subprocess.run([cli, "export", store, str(out), "--format", "mha", "--id", "p01", "--field", "CT"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    back = sitk.ReadImage(str(out / "p01" / "CT.mha"))
    assert same_bits(sitk.GetArrayFromImage(back), patchstore.open(store).volume("p01")["CT"])
    # verify checks the geometry entries too.
    assert subprocess.run([cli, "verify", store], capture_output=True).returncode == 0


def test_copies_keep_the_geometry(tmp_path):
    rng = np.random.default_rng(19)
    cohort(tmp_path / "data", rng, n=2, shape=(8, 6, 4))
    store = tmp_path / "v.ps"
    patchstore.ingest_volumes(store, root=tmp_path / "data", fields=FIELDS, masks=["MASK"], orient="RAS",
                              progress=False)
    src = patchstore.open(store)
    for name, encoding in (("compacted.ps", None), ("reencoded.ps", "compact")):
        patchstore.copy(store, tmp_path / name, encoding=encoding, progress=False)
        dst = patchstore.open(tmp_path / name)
        for pid in ("p00", "p01"):
            assert dst.volume(pid).geometry == src.volume(pid).geometry, name
            assert same_bits(dst.volume(pid)["CT"], src.volume(pid)["CT"])
    assert patchstore.open(tmp_path / "reencoded.ps").fields["MR"].dtype == "int16"


def test_hdf5_store_has_no_geometry_and_exports_with_unit_spacing(tmp_path):
    import h5py

    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("MR/p1", data=np.arange(4 * 5 * 6, dtype=np.int16).reshape(4, 5, 6))
    patchstore.ingest_hdf5(tmp_path / "v.h5", tmp_path / "v.ps", groups=["MR"], progress=False)
    vol = patchstore.open(tmp_path / "v.ps").volume("p1")
    assert vol.geometry is None and vol.spacing is None and vol.affine is None
    with pytest.warns(RuntimeWarning, match="no geometry"):
        patchstore.export(tmp_path / "v.ps", tmp_path / "out", format="nifti")
    back = sitk.ReadImage(str(tmp_path / "out" / "p1" / "MR.nii.gz"))
    assert back.GetSpacing() == (1.0, 1.0, 1.0)
    assert same_bits(sitk.GetArrayFromImage(back), vol["MR"])


# -- 7. the manual's example runs as written ----------------------------------------------------------


def test_volumes_guide_snippet_runs(tmp_path):
    import re
    import sys

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "volumes.md").read_text(encoding="utf-8")
    section = guide.split("## NIfTI, MetaImage, NRRD and DICOM", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    rng = np.random.default_rng(16)
    aff = affine((0.8, 0.9, 2.5), (-10.0, 20.0, 30.0))
    for pid in ("patient001", "patient002"):
        d = tmp_path / "data" / pid
        write_nifti(d / "mr.nii.gz", rng.integers(0, 3000, (20, 16, 12)).astype(np.int16), aff)
        write_nifti(d / "ct.nii.gz", rng.uniform(-1024, 3000, (20, 16, 12)).astype(np.float32), aff)
        write_nifti(d / "mask.nii.gz", (rng.random((20, 16, 12)) < 0.3).astype(np.uint8), aff)
    (tmp_path / "snippet.py").write_text(code)
    out = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONWARNINGS="default", PYTHONPATH=os.pathsep.join(
                             os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # LPS, resampled to (1, 1, 2.5): 20*0.8/1 = 16, 16*0.9/1 = 14.4 -> 14, 12 slices.
    assert lines[0].startswith("(12, 14, 16) (1.0, 1.0, 2.5) ("), lines
    # LPS flips i and j of this RAS file: the first voxel is the old (19, 15, 0), at LPS (-5.2, -33.5, 30).
    origin = [float(x) for x in lines[0].split("(")[3].rstrip(")").split(",")]
    np.testing.assert_allclose(origin, (-5.2, -33.5, 30.0), atol=1e-4)
    store = patchstore.open(tmp_path / "synthrad.ps")
    assert list(store.ids) == ["patient001", "patient002"] and store.sealed


def test_mixed_voxel_types_under_compact_name_the_way_out_and_it_works(tmp_path):
    # compact gives a field the type of its first volume; a later float32 CT cannot be held as int16. The
    # refusal names the way out (copy to float32, ingest again there), and following it stores every value.
    cli = cli_or_skip()
    data = {}
    for p, dt in (("a1", np.int16), ("a2", np.int16), ("b1", np.float32)):
        vol = (np.arange(12 * 10 * 5).reshape(12, 10, 5) % 211 - 90).astype(dt) + (0.25 if dt == np.float32 else 0)
        (tmp_path / "d" / p).mkdir(parents=True)
        nib.save(nib.Nifti1Image(vol, np.eye(4)), tmp_path / "d" / p / "ct.nii.gz")
        data[p] = vol
    args = ["--root", str(tmp_path / "d"), "--field", "CT={p}/ct.nii.gz"]
    r = subprocess.run([cli, "-q", "ingest", "volumes", str(tmp_path / "c.ps"), *args, "--encoding", "compact"],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "'b1'" in r.stderr and "field 'CT' is stored as int16" in r.stderr, r.stderr
    assert "patchstore copy STORE NEW --encoding CT=float32" in r.stderr, r.stderr
    assert f"what was committed stays in '{tmp_path / 'c.ps'}'" in r.stderr and "--on-error skip" in r.stderr
    r = subprocess.run([cli, "-q", "copy", str(tmp_path / "c.ps"), str(tmp_path / "f.ps"), "--encoding", "CT=float32"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([cli, "-q", "ingest", "volumes", str(tmp_path / "f.ps"), *args, "--encoding", "CT=float32"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "ingested 1 new volumes (2 already present" in r.stdout, r.stdout + r.stderr
    s = patchstore.open(tmp_path / "f.ps")
    for p, vol in data.items():
        np.testing.assert_array_equal(s.get(p, "CT"), np.transpose(vol, (2, 1, 0)).astype(np.float32))


def test_a_sample_without_a_file_of_the_first_field_is_named(tmp_path):
    # The first field's files define the volumes; a folder holding only a later field's file is not ingested, and
    # that is said (it was silent: a patient whose MR failed to download simply went missing).
    a = (np.arange(9 * 7 * 3) % 97).reshape(9, 7, 3).astype(np.int16)
    for p, names in (("p1", ("mr", "ct")), ("p2", ("ct",)), ("p3", ("mr", "ct")), ("p4", ("ct",))):
        for n in names:
            write_nifti(tmp_path / "d" / p / f"{n}.nii.gz", a, affine((1, 1, 2), (0, 0, 0)))
    fields = {"MR": "{p}/mr.nii.gz", "CT": "{p}/ct.nii.gz"}
    with pytest.warns(RuntimeWarning, match=r"2 sample\(s\) .* none matching the first field's template "
                                            r"'\{p\}/mr\.nii\.gz' \(field 'MR'.*'p2' \('p2/ct\.nii\.gz' of field "
                                            r"'CT'\), 'p4'"):
        s = patchstore.ingest_volumes(tmp_path / "s.ps", root=tmp_path / "d", fields=fields, progress=False)
    assert (s.samples_total, s.samples_written) == (2, 2)
    assert sorted(patchstore.open(tmp_path / "s.ps").ids) == ["p1", "p3"]
