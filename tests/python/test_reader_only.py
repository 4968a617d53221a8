"""A reader-only build (CMake PATCHSTORE_INGEST=OFF) has no ``patchstore._ingest``: reading and patchstore.torch
work without it, and every function that needs it raises ImportError saying the build has no ingest.

Here the module is hidden (None in sys.modules, as Python does for a module that must not load); the real
reader-only build is checked by tests/install/reader_only.sh.
"""
import sys

import numpy as np
import pytest

import patchstore

NO_INGEST = "this build of patchstore has no ingest (built with PATCHSTORE_INGEST=OFF"


@pytest.fixture
def without_ingest(monkeypatch):
    monkeypatch.setitem(sys.modules, "patchstore._ingest", None)


def test_reading_needs_no_ingest_module(frameset, without_ingest):
    import patchstore.torch  # noqa: F401

    s = patchstore.open(frameset.store)
    fid = sorted(frameset.frames)[0]
    want = frameset.frames[fid].expected()["rgb"][:, 2:10, 3:12]
    assert np.array_equal(s.patch(fid, "rgb", 2, 3, 8, 9), want)
    sampler = patchstore.PatchSampler(frameset.store, ["rgb"], patch_size=8, num_threads=1)
    assert sampler.batch(2)["rgb"].shape == (2, 3, 8, 8)


@pytest.mark.parametrize("name, call", [
    ("patchstore.ingest_images", lambda d, s: patchstore.ingest_images(d / "x.ps", root=d, fields={"a": "{f}.png"})),
    ("patchstore.ingest_hdf5", lambda d, s: patchstore.ingest_hdf5(d / "x.h5", d / "x.ps", groups=["MR"])),
    ("patchstore.export", lambda d, s: patchstore.export(s, d / "out")),
    ("patchstore.copy", lambda d, s: patchstore.copy(s, d / "copy.ps")),
    ("montage", lambda d, s: patchstore.open(s).montage(4, 8, field="rgb")),
])
def test_ingest_functions_say_the_build_has_no_ingest(frameset, tmp_path, without_ingest, name, call):
    with pytest.raises(ImportError) as e:
        call(tmp_path, frameset.store)
    assert str(e.value).startswith(f"{name}: {NO_INGEST}"), str(e.value)
    assert e.value.name == "patchstore._ingest"
    assert not (tmp_path / "x.ps").exists() and not (tmp_path / "copy.ps").exists() and not (tmp_path / "out").exists()


def test_a_broken_ingest_module_is_not_called_missing(frameset, tmp_path, monkeypatch):
    # An _ingest that exists but cannot load (a missing OpenCV .so) keeps its own error.
    import importlib

    def fail(name, *args, **kwargs):
        if name == "patchstore._ingest":
            raise ImportError("libopencv_core.so.406: cannot open shared object file")
        return real(name, *args, **kwargs)

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", fail)
    with pytest.raises(ImportError, match="libopencv_core.so.406"):
        patchstore.export(frameset.store, tmp_path / "out")
