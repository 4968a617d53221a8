"""One ingest pipeline (ingest/driver.h): resume after a stop, on_error="skip" with its report, shard
and progress behave the same for images, HDF5 and ITK volumes.

Each format gets the same input: six units u0..u5 with two fields each, where u3 can be broken (a
file that does not decode) and fixed again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
from PIL import Image

import patchstore

IDS = [f"u{i}" for i in range(6)]
BROKEN = "u3"


def _rng(uid: str) -> np.random.Generator:
    return np.random.default_rng(int(uid[1:]) + 7)


class Images:
    fields = ("rgb", "mask")

    def write(self, root: Path, uid: str) -> None:
        d = root / uid
        d.mkdir(parents=True, exist_ok=True)
        rng = _rng(uid)
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(d / "rgb.png")
        Image.fromarray((rng.random((12, 10)) < 0.5).astype(np.uint8) * 255).save(d / "mask.png")

    def break_(self, root: Path, uid: str) -> None:
        (root / uid / "rgb.png").write_bytes(b"this is not a PNG file")

    def ingest(self, root: Path, store: Path, **kw: Any) -> Any:
        return patchstore.ingest_images(store, root=root, fields={"rgb": "{id}/rgb.png", "mask": "{id}/mask.png"},
                                        threads=2, durable=False, **kw)


class Hdf5:
    fields = ("MR", "MASK")

    def write(self, root: Path, uid: str, rank: int = 3) -> None:
        h5py = pytest.importorskip("h5py")
        root.mkdir(parents=True, exist_ok=True)
        rng = _rng(uid)
        shape = (4, 6, 5) if rank == 3 else (6, 5)
        with h5py.File(root / f"{uid}.h5", "w") as f:
            f["MR"] = rng.integers(0, 1000, shape).astype(np.int16)
            f["MASK"] = (rng.random(shape) < 0.5).astype(np.uint8)

    def break_(self, root: Path, uid: str) -> None:
        self.write(root, uid, rank=2)  # a 2D dataset is not a volume

    def ingest(self, root: Path, store: Path, **kw: Any) -> Any:
        files = sorted(str(p) for p in root.glob("*.h5"))
        return patchstore.ingest_hdf5(files, store, groups=["MR", "MASK"], masks=["MASK"], durable=False, **kw)


class Itk:
    fields = ("MR", "MASK")

    def write(self, root: Path, uid: str) -> None:
        nib = pytest.importorskip("nibabel")
        d = root / uid
        d.mkdir(parents=True, exist_ok=True)
        rng = _rng(uid)
        aff = np.diag([0.8, 0.9, 2.5, 1.0])
        for name, arr in (("mr", rng.integers(0, 1000, (5, 6, 4)).astype(np.int16)),
                          ("mask", (rng.random((5, 6, 4)) < 0.5).astype(np.uint8))):
            nib.save(nib.Nifti1Image(arr, aff), str(d / f"{name}.nii.gz"))

    def break_(self, root: Path, uid: str) -> None:
        (root / uid / "mr.nii.gz").write_bytes(b"this is not a NIfTI file")

    def ingest(self, root: Path, store: Path, **kw: Any) -> Any:
        from patchstore import _ingest
        if not _ingest.volume_ingest_available():
            pytest.skip("built without ITK")
        return patchstore.ingest_volumes(store, root=root, fields={"MR": "{id}/mr.nii.gz",
                                                                   "MASK": "{id}/mask.nii.gz"},
                                         masks=["MASK"], threads=2, durable=False, **kw)


FORMATS: Dict[str, Callable[[], Any]] = {"images": Images, "hdf5": Hdf5, "itk": Itk}


@pytest.fixture(params=sorted(FORMATS))
def fmt(request):
    return FORMATS[request.param]()


def make_input(fmt: Any, root: Path, broken: bool) -> Path:
    for uid in IDS:
        fmt.write(root, uid)
    if broken:
        fmt.break_(root, BROKEN)
    return root


def contents(store: Path, fields) -> List[Any]:
    st = patchstore.open(store)
    out = [(uid, [st.get(uid, f).tobytes() for f in fields]) for uid in st.ids]
    st.close()
    return out


def test_resume_after_a_stop_equals_an_uninterrupted_run(fmt, tmp_path):
    whole = tmp_path / "whole.ps"
    fmt.ingest(make_input(fmt, tmp_path / "good", broken=False), whole, progress=False)
    root = make_input(fmt, tmp_path / "in", broken=True)
    store = tmp_path / "resumed.ps"
    with pytest.raises(Exception, match="stopped after 3 new"):
        fmt.ingest(root, store, progress=False)
    st = patchstore.open(store)
    assert list(st.ids) == IDS[:3] and not st.sealed  # the units before the broken one are committed
    st.close()
    fmt.write(root, BROKEN)  # fixed
    s = fmt.ingest(root, store, progress=False)
    assert (s.samples_present, s.samples_written, s.samples_failed) == (3, 3, 0)
    assert patchstore.open(store).sealed
    assert contents(store, fmt.fields) == contents(whole, fmt.fields)


def test_on_error_skip_reports_the_unit_and_goes_on(fmt, tmp_path):
    root = make_input(fmt, tmp_path / "in", broken=True)
    store = tmp_path / "s.ps"
    report = tmp_path / "failures.tsv"
    s = fmt.ingest(root, store, on_error="skip", report=report, progress=False)
    assert (s.samples_written, s.samples_failed) == (5, 1)
    assert Path(s.report_path) == report and len(s.errors) == 1
    lines = report.read_text().splitlines()
    assert len(lines) == 1 and lines[0].split("\t")[0] == BROKEN, lines
    st = patchstore.open(store)
    assert list(st.ids) == [u for u in IDS if u != BROKEN] and not st.sealed  # a failure leaves it open
    st.close()
    fmt.write(root, BROKEN)
    s = fmt.ingest(root, store, on_error="skip", report=report, progress=False)
    assert (s.samples_present, s.samples_written, s.samples_failed) == (5, 1, 0)
    assert patchstore.open(store).sealed


def test_shards_split_the_input_and_read_as_one_ingest(fmt, tmp_path):
    root = make_input(fmt, tmp_path / "in", broken=False)
    whole = tmp_path / "whole.ps"
    fmt.ingest(root, whole, progress=False)
    parts = []
    for i in range(2):
        s = fmt.ingest(root, tmp_path / f"s{i}.ps", shard=(i, 2), progress=False)
        assert s.samples_failed == 0 and s.samples_total == s.samples_written
        parts.append(list(patchstore.open(tmp_path / f"s{i}.ps").ids))
    assert sorted(parts[0] + parts[1]) == IDS and not set(parts[0]) & set(parts[1])
    both = patchstore.open([tmp_path / "s0.ps", tmp_path / "s1.ps"])
    single = patchstore.open(whole)
    for uid in IDS:
        for f in fmt.fields:
            assert both.get(uid, f).tobytes() == single.get(uid, f).tobytes()


def test_progress_counts_every_unit_and_ends_done(fmt, tmp_path):
    root = make_input(fmt, tmp_path / "in", broken=True)
    seen: List[Any] = []
    fmt.ingest(root, tmp_path / "s.ps", on_error="skip", progress=False,
               callback=lambda p: seen.append((p.done, p.total, p.failed)))
    assert seen and seen[-1] == (len(IDS), len(IDS), 1), seen
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
