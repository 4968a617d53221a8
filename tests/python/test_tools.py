"""The data generators the README's quick starts name (tools/make_volumes.py) write what the quick starts read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

import patchstore

ROOT = Path(__file__).resolve().parents[2]


def test_make_volumes_writes_the_volumes_quick_start_layout(tmp_path):
    out = tmp_path / "synthrad.h5"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "make_volumes.py"), str(out), "--patients", "2",
                        "--size", "40", "--slices", "3", "--seed", "7"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with h5py.File(out, "r") as f:
        assert sorted(f) == ["CT", "MASK", "MR"]
        vols = {g: {p: f[g][p][()] for p in f[g]} for g in f}
        assert all(f[g][p].compression == "gzip" for g in f for p in f[g])
    assert {g: sorted(per) for g, per in vols.items()} == {g: ["1PA001", "1PA002"] for g in ("CT", "MASK", "MR")}
    for g, dtype in (("MR", np.int16), ("CT", np.int16), ("MASK", np.uint8)):
        for a in vols[g].values():
            assert a.shape == (40, 40, 3) and a.dtype == dtype, (g, a.shape, a.dtype)
    ct, mr, mask = vols["CT"]["1PA001"], vols["MR"]["1PA001"], vols["MASK"]["1PA001"]
    assert ct.min() == -1024 and 500 < ct.max() <= 3000  # air clipped at -1024 HU, bone above 500 HU
    assert 0 <= mr.min() and mr.max() <= 3000
    assert set(np.unique(mask)) == {0, 1} and np.all(ct[mask == 0] < -900)  # outside the body: air

    # Ingested as the quick start does it, with the values as stored (no norm): (S, H, W) float32, exact.
    summary = patchstore.ingest_hdf5(out, tmp_path / "synthrad.ps", groups=("MR", "CT", "MASK"))
    assert (summary.samples_written, summary.samples_failed) == (2, 0)
    store = patchstore.open(tmp_path / "synthrad.ps")
    assert list(store.ids) == ["1PA001", "1PA002"]
    for g, per in vols.items():
        for p, a in per.items():
            got = store.volume(p, g)
            assert got.shape == (3, 40, 40)
            np.testing.assert_array_equal(got, np.moveaxis(a, -1, 0).astype(np.float32))
