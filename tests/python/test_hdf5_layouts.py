"""`patchstore ingest hdf5` with one file per patient (datasets MR/CT/MASK at
the root), mixed with the group layout, and a file of neither layout, through
the CLI and through patchstore.ingest_hdf5. Sources written with h5py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

import patchstore


def write_patient(path: Path, shape, seed: int) -> dict:
    """(H, W, S) datasets at the root: MR int16, CT float32, MASK uint8."""
    rng = np.random.default_rng(seed)
    vols = {
        "MR": rng.integers(-300, 2200, shape).astype(np.int16),
        "CT": (rng.standard_normal(shape) * 750 - 20).astype(np.float32),
        "MASK": rng.integers(0, 4, shape).astype(np.uint8),
    }
    with h5py.File(path, "w") as f:
        f.create_dataset("MR", data=vols["MR"], compression="gzip", chunks=(4, 3, 2))
        f.create_dataset("CT", data=vols["CT"])
        f.create_dataset("MASK", data=vols["MASK"], chunks=True)
    return vols


def as_shw(a: np.ndarray) -> np.ndarray:
    return np.moveaxis(a, -1, 0).astype(np.float32)


@pytest.fixture
def cohort(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    want = {"sub-03": write_patient(d / "sub-03.h5", (9, 7, 4), 3),
            "sub-11": write_patient(d / "sub-11.h5", (6, 10, 5), 11)}
    # One file of the group layout beside them.
    rng = np.random.default_rng(5)
    grouped = {g: rng.integers(0, 90, (5, 4, 3)).astype(np.uint16) for g in ("MR", "CT", "MASK")}
    with h5py.File(d / "legacy.h5", "w") as f:
        for g, a in grouped.items():
            f.create_group(g).create_dataset("p9", data=a)
    want["legacy/p9"] = grouped
    return d, want


def check(store: Path, want: dict) -> None:
    s = patchstore.open(store)
    assert sorted(s.ids) == sorted(want) and s.sealed
    for sid, vols in want.items():
        for g, a in vols.items():
            got = np.asarray(s.volume(sid, g))
            assert got.dtype == np.float32 and got.tobytes() == as_shw(a).tobytes(), (sid, g)


def test_cli_per_patient_files_mixed_with_groups(cohort, tmp_path, cli):
    assert cli is not None and os.path.exists(cli), "set PATCHSTORE_CLI to the patchstore program"
    d, want = cohort
    files = sorted(str(p) for p in d.glob("*.h5"))
    out = tmp_path / "v.ps"
    r = subprocess.run([cli, "-q", "ingest", "hdf5", *files, str(out), "--group", "MR", "--group", "CT",
                        "--group", "MASK", "--no-sync"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ingested 3 new volumes (0 already present, 0 failed) of 3" in r.stdout
    check(out, want)
    # The Python API gives the same store.
    py = tmp_path / "py.ps"
    patchstore.ingest_hdf5(files, py, groups=["MR", "CT", "MASK"], durable=False)
    check(py, want)


def test_cli_file_of_neither_layout_lists_its_root(cohort, tmp_path, cli):
    d, _ = cohort
    bad = tmp_path / "odd.h5"
    with h5py.File(bad, "w") as f:
        f.create_dataset("MR", data=np.zeros((3, 4, 2), np.int16))
        f.create_group("CT").create_dataset("p1", data=np.zeros((3, 4, 2), np.int16))
    r = subprocess.run([cli, "-q", "ingest", "hdf5", str(bad), str(tmp_path / "x.ps"), "--group", "MR",
                        "--group", "CT"], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.startswith(f"patchstore: error: ingest into '{tmp_path / 'x.ps'}' stopped after 0 new volumes")
    assert (f"reading '{bad}': --group 'CT' name groups but 'MR' name datasets; a file is "
            "either layout, not both. The file holds at its root: group 'CT' (1 members), dataset 'MR' "
            "(int16 3x4x2). Accepted layouts: (1)") in r.stderr
    assert not (tmp_path / "x.ps").exists()
    # --on-error skip: the per-patient files are ingested, the odd one reported.
    out = tmp_path / "skip.ps"
    r = subprocess.run([cli, "-q", "ingest", "hdf5", str(d / "sub-03.h5"), str(bad), str(out), "--group", "MR",
                        "--group", "CT", "--on-error", "skip", "--no-sync"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ingested 1 new volumes (0 already present, 1 failed) of 2" in r.stdout
    report = (out / "ingest-errors.tsv").read_text()
    assert report.startswith(f"\t{bad}\treading '{bad}': --group 'CT' name groups")
    assert list(patchstore.open(out).ids) == ["sub-03"]


def test_help_describes_both_layouts(cli):
    r = subprocess.run([cli, "ingest", "hdf5", "--help"], capture_output=True, text=True, check=True)
    assert "per patient: /MR /CT /MASK" in r.stdout and "groups:      /MR/patient001" in r.stdout
