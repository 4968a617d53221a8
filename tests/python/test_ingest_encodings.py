"""Ingest side of layouts and encodings (issue 13): what patchstore.ingest_images / ingest_hdf5 and the CLI
write and refuse. The values the readers return are compared in test_encodings_e2e.py (needs the tile- and
dtype-aware reader)."""
import json
import subprocess

import h5py
import numpy as np
import pytest

import patchstore

from conftest import TEMPLATES, H, W, make_frames


@pytest.fixture(scope="module")
def frames_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("enc") / "data"
    make_frames(root, ["v"], range(3))
    return root


def ingest(store, root, **kw):
    return patchstore.ingest_images(store, root=root, fields=TEMPLATES, durable=False, isolate_decoders=False,
                                    progress=False, **kw)


def tiled_elements(c, t):
    return c * (-(-H // t)) * (-(-W // t)) * t * t


@pytest.mark.parametrize("encoding, layout, sizes", [
    ("float32", "rows", {"rgb": 4, "mask": 4, "depth": 4}),
    ("compact", "rows", {"rgb": 1, "mask": 1, "depth": 4}),
    ({"*": "compact", "depth": "float16"}, "rows", {"rgb": 1, "mask": 1, "depth": 2}),
    (["compact", "rgb=float32"], "tiles", {"rgb": 4, "mask": 1, "depth": 4}),
    ({"mask": "compact"}, "tiles", {"rgb": 4, "mask": 1, "depth": 4}),
])
def test_record_bytes_follow_the_encoding_and_layout(tmp_path, frames_root, encoding, layout, sizes):
    s = ingest(tmp_path / "s.ps", frames_root, encoding=encoding, layout=layout,
               tile_size=32 if layout == "tiles" else None)
    assert s.samples_written == 3
    channels = {"rgb": 3, "mask": 1, "depth": 1}
    if layout == "rows":
        per_frame = sum(channels[f] * H * W * sizes[f] for f in channels)
    else:  # 48x64 in 32x32 tiles: 2x2 tiles, the last tile row padded
        per_frame = sum(tiled_elements(channels[f], 32) * sizes[f] for f in channels)
    assert s.bytes_written == 3 * per_frame


def test_bad_options_are_errors_naming_them(tmp_path, frames_root):
    with pytest.raises(ValueError, match="--encoding names field 'normals', which the input does not have"):
        ingest(tmp_path / "a.ps", frames_root, encoding={"normals": "float16"})
    with pytest.raises(ValueError, match="unknown encoding 'int4'"):
        ingest(tmp_path / "a.ps", frames_root, encoding="int4")
    with pytest.raises(ValueError, match="float16 loses precision, so it is given per field"):
        ingest(tmp_path / "a.ps", frames_root, encoding="float16")
    with pytest.raises(ValueError,
                       match=r"tile_size must be a multiple of 8 in 8..4096 \(or None: the default\), got 12"):
        ingest(tmp_path / "a.ps", frames_root, layout="tiles", tile_size=12)
    with pytest.raises(ValueError, match="layout must be 'rows' or 'tiles'"):
        ingest(tmp_path / "a.ps", frames_root, layout="columns")
    with pytest.raises(ValueError, match="tile_size=64 is for layout='tiles'"):
        ingest(tmp_path / "a.ps", frames_root, tile_size=64)
    with pytest.raises(TypeError, match="encoding= list items are strings"):
        ingest(tmp_path / "a.ps", frames_root, encoding=["compact", 3])
    assert not (tmp_path / "a.ps").exists()


def test_a_resume_with_another_encoding_or_layout_is_refused_and_changes_nothing(tmp_path, frames_root):
    store = tmp_path / "s.ps"
    ingest(store, frames_root, encoding="compact", layout="tiles", tile_size=16)
    before = (store / "data.mdb").read_bytes()
    with pytest.raises(ValueError, match=r"field 'rgb' is stored as uint8 but this ingest's --encoding \(float32"):
        ingest(store, frames_root, layout="tiles", tile_size=16)
    with pytest.raises(ValueError, match=r"stored in 16-pixel tiles .* asks for rows \(--layout rows\)"):
        ingest(store, frames_root, encoding="compact")
    with pytest.raises(ValueError, match=r"asks for 32-pixel tiles"):
        ingest(store, frames_root, encoding="compact", layout="tiles", tile_size=32)
    assert (store / "data.mdb").read_bytes() == before
    s = ingest(store, frames_root, encoding="compact", layout="tiles", tile_size=16)
    assert (s.samples_written, s.samples_present) == (0, 3)
    # layout="tiles" without tile_size resumes with the store's own edge, not the default.
    s = ingest(store, frames_root, encoding="compact", layout="tiles")
    assert (s.samples_written, s.samples_present) == (0, 3)


def test_tiles_without_tile_size_default_to_64_pixel_tiles_and_resume_with_the_stores_own(tmp_path, cli):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    two, three = tmp_path / "two" / "data", tmp_path / "three" / "data"
    make_frames(two, ["v"], range(2))
    make_frames(three, ["v"], range(3))  # the same first two frames (same seed), and one more
    store = tmp_path / "d.ps"
    assert ingest(store, two, layout="tiles", encoding="compact").samples_written == 2

    def tiles():
        out = subprocess.run([cli, "info", str(store), "--json"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return {f["name"]: (f["layout"], f["tile_size"]) for f in json.loads(out.stdout)["fields"]}

    assert tiles() == {"rgb": ("tiles", 64), "mask": ("tiles", 64), "depth": ("tiles", 64)}
    with pytest.raises(ValueError, match=r"stored in 64-pixel tiles .* asks for 32-pixel tiles"):
        ingest(store, three, encoding="compact", layout="tiles", tile_size=32)
    s = ingest(store, three, layout="tiles", encoding="compact")
    assert (s.samples_written, s.samples_present) == (1, 2)
    assert tiles()["rgb"] == ("tiles", 64)


def test_info_shows_dtype_and_layout(tmp_path, frames_root, cli):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    store = tmp_path / "t.ps"
    ingest(store, frames_root, layout="tiles", tile_size=16)
    out = subprocess.run([cli, "info", str(store), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    fields = {f["name"]: f for f in json.loads(out.stdout)["fields"]}
    assert {n: (f["dtype"], f["layout"], f["tile_size"]) for n, f in fields.items()} == {
        "rgb": ("float32", "tiles", 16), "mask": ("float32", "tiles", 16), "depth": ("float32", "tiles", 16)}
    text = subprocess.run([cli, "info", str(store)], capture_output=True, text=True, timeout=60).stdout
    assert "dtype=float32 layout=tiles 16" in text, text
    rows = tmp_path / "r.ps"
    ingest(rows, frames_root)
    out = subprocess.run([cli, "info", str(rows), "--json"], capture_output=True, text=True, timeout=60)
    assert [(f["dtype"], f["layout"], f["tile_size"]) for f in json.loads(out.stdout)["fields"]] == [
        ("float32", "rows", 0)] * 3


def test_cli_flags_reach_the_ingest(tmp_path, frames_root, cli):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    def run(store, *extra):
        args = [cli, "-q", "ingest", "images", str(store), "--root", str(frames_root), "--in-process", "--no-sync"]
        for name, t in TEMPLATES.items():
            args += ["--field", f"{name}={t}"]
        return subprocess.run(args + list(extra), capture_output=True, text=True, timeout=60)

    out = run(tmp_path / "c.ps", "--encoding", "compact", "--encoding", "depth=float16", "--layout", "tiles",
              "--tile-size", "8")
    assert out.returncode == 0, out.stderr
    assert " of records in " in out.stdout, out.stdout
    bad = run(tmp_path / "d.ps", "--encoding", "depth=bfloat16")
    assert bad.returncode == 1 and "unknown encoding 'bfloat16'" in bad.stderr, bad.stderr
    bad = run(tmp_path / "d.ps", "--tile-size", "64")
    assert bad.returncode == 2 and "--tile-size is for --layout tiles" in bad.stderr, bad.stderr
    bad = run(tmp_path / "d.ps", "--layout", "tiles", "--tile-size", "20")
    assert bad.returncode == 2 and "--tile-size must be a multiple of 8" in bad.stderr, bad.stderr
    resume = run(tmp_path / "c.ps", "--layout", "tiles", "--tile-size", "8")  # float32
    assert resume.returncode == 1 and "a store keeps the encoding of its first ingest" in resume.stderr, resume.stderr
    resume = run(tmp_path / "c.ps")
    assert resume.returncode == 1 and "a store keeps the layout of its first ingest" in resume.stderr, resume.stderr
    resume = run(tmp_path / "c.ps", "--encoding", "compact", "--encoding", "depth=float16", "--layout", "tiles",
                 "--tile-size", "32")
    assert resume.returncode == 1 and "asks for 32-pixel tiles" in resume.stderr, resume.stderr
    resume = run(tmp_path / "c.ps", "--encoding", "compact", "--encoding", "depth=float16", "--layout", "tiles")
    assert resume.returncode == 0, resume.stderr  # keeps the store's 8-pixel tiles
    helptext = subprocess.run([cli, "ingest", "images", "--help"], capture_output=True, text=True).stdout
    assert "--layout" in helptext and "--tile-size" in helptext and "2^-11" in helptext


def write_h5(path):
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        f["MR/p1"] = rng.integers(-32768, 32767, (8, 6, 5), dtype=np.int16)
        f["CT/p1"] = rng.integers(0, 65535, (8, 6, 5), dtype=np.uint16)
        f["MASK/p1"] = rng.integers(0, 3, (8, 6, 5), dtype=np.uint8)
        f["F/p1"] = rng.random((8, 6, 5), dtype=np.float32)
        f["I8/p1"] = rng.integers(-128, 127, (8, 6, 5), dtype=np.int8)


def test_hdf5_compact_bytes_and_refusals(tmp_path, cli):
    h5 = tmp_path / "v.h5"
    write_h5(h5)
    groups = ["MR", "CT", "MASK", "F", "I8"]
    s = patchstore.ingest_hdf5(h5, tmp_path / "c.ps", groups, masks=["MASK"], encoding="compact", durable=False,
                               progress=False)
    n = 8 * 6 * 5
    assert s.bytes_written == n * (2 + 2 + 1 + 4 + 2)  # int16, uint16, uint8, float32, int8 -> int16
    s = patchstore.ingest_hdf5(h5, tmp_path / "h.ps", groups, encoding={"F": "float16", "MR": "compact"},
                               durable=False, progress=False)
    assert s.bytes_written == n * (2 + 4 + 4 + 2 + 4)
    with pytest.raises(ValueError, match="tiles would not help"):
        patchstore.ingest_hdf5(h5, tmp_path / "t.ps", groups, layout="tiles", progress=False)
    with pytest.raises(ValueError, match="--encoding names field 'PET'"):
        patchstore.ingest_hdf5(h5, tmp_path / "t.ps", groups, encoding={"PET": "compact"}, progress=False)
    assert not (tmp_path / "t.ps").exists()
    with pytest.raises(ValueError, match="field 'MR' is stored as int16"):
        patchstore.ingest_hdf5(h5, tmp_path / "c.ps", groups, masks=["MASK"], progress=False)
    if cli is not None:
        out = subprocess.run([cli, "ingest", "hdf5", str(h5), str(tmp_path / "t.ps"), "--group", "MR", "--layout",
                              "tiles"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "tiles would not help" in out.stderr, out.stderr
