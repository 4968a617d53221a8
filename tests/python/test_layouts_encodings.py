"""Export and verify on every record layout x encoding (issue "Scale 2").

The same seed-layout frames (8-bit rgb PNG, 0/255 mask PNG, float32 EXR depth;
sizes that are not multiples of the tile edge) are ingested as rows and tiles,
float32 and compact, through the command line; export must give back the
source pixels exactly and verify must pass. (The read paths against the
float32 rows: test_encodings_e2e.py and tests/reader/encoding_test.cc.)
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from PIL import Image

import patchstore
from patchstore import _ingest

from conftest import TEMPLATES, make_frames, read_exr

CONFIGS = [
    ("rows", "float32", []),
    ("tiles", "float32", ["--layout", "tiles", "--tile-size", "16"]),
    ("rows", "compact", ["--encoding", "compact"]),
    ("tiles", "compact", ["--layout", "tiles", "--tile-size", "8", "--encoding", "compact"]),
]


@pytest.fixture(scope="module")
def stores(tmp_path_factory, cli):
    base = tmp_path_factory.mktemp("layouts")
    root = base / "data"
    # 37 x 53: no tile edge divides it; 3 frames, one with an empty mask.
    frames = make_frames(root, ["video01"], range(1, 4), h=37, w=53, seed=5, empty=["video01/0002"])
    out = {}
    for layout, encoding, flags in CONFIGS:
        path = str(base / f"{layout}-{encoding}.ps")
        args = [cli, "--quiet", "ingest", "images", path, "--root", str(root), "--no-sync"]
        for name, tpl in TEMPLATES.items():
            args += ["--field", f"{name}={tpl}"]
        subprocess.run(args + flags, check=True)
        out[(layout, encoding)] = path
    return frames, out


@pytest.mark.parametrize("layout,encoding", [(c[0], c[1]) for c in CONFIGS])
def test_export_gives_back_the_source_pixels(stores, tmp_path, layout, encoding):
    frames, paths = stores
    out = tmp_path / "out"
    summary = patchstore.export(paths[(layout, encoding)], out)
    assert summary.files_written == 3 * len(frames)
    for sid, fr in frames.items():
        d = out / os.fsdecode(_ingest.safe_relative_path(sid.encode()))
        np.testing.assert_array_equal(np.asarray(Image.open(d / "rgb.png")), fr.rgb)
        np.testing.assert_array_equal(np.asarray(Image.open(d / "mask.png")), fr.mask)
        np.testing.assert_array_equal(read_exr(d / "depth.exr")["Z"].view(np.uint32), fr.depth.view(np.uint32))


@pytest.mark.parametrize("layout,encoding", [(c[0], c[1]) for c in CONFIGS])
def test_verify_passes_and_names_a_damaged_record(stores, tmp_path, cli, layout, encoding):
    _, paths = stores
    ok = subprocess.run([cli, "verify", paths[(layout, encoding)]], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
