"""End to end (issue 13): every layout x encoding x source type, read through the store (read_patches, store[...],
slices), equals the float32 row store bit for bit; float16 fields equal its values rounded to binary16
(NumPy's astype(float16): round to nearest even).

Needs the reader that understands tiled records and compact dtypes; without it these tests fail (the store
refuses to open, or tiles read as rows)."""
import csv
import json
import subprocess

import h5py
import numpy as np
import pytest
from PIL import Image

import patchstore

from conftest import H, W, make_frames, write_exr

CONFIGS = [
    ("tiles", 8, "float32", ()),
    ("tiles", 32, "float32", ()),
    ("rows", None, "compact", ()),
    ("tiles", 16, "compact", ()),
    ("rows", None, {"*": "compact", "depth": "float16", "rgb": "float16"}, ("depth", "rgb")),
    ("tiles", 8, ["compact", "g16=float16"], ("g16",)),
]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Frames with rgb (8-bit RGB PNG), mask (8-bit, 0/255), depth (float32 EXR), g16 (16-bit gray PNG) and
    zh (half EXR); the float32 row store of them."""
    base = tmp_path_factory.mktemp("e2e")
    frames = make_frames(base / "data", ["v"], range(4))
    rng = np.random.default_rng(5)
    raw = {}
    with open(base / "manifest.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "rgb", "mask", "depth", "g16", "zh"])
        for fid, fr in frames.items():
            stem = fid.replace("/", "_")
            g16 = rng.integers(0, 65536, (H, W), dtype=np.uint16)
            Image.fromarray(g16).save(base / f"{stem}_g16.png")
            zh = rng.standard_normal((H, W)).astype(np.float16)
            write_exr(base / f"{stem}_zh.exr", {"Z": zh})
            v, n = fid.split("/")
            w.writerow([fid, f"data/{v}/render/rgb/{n}.png", f"data/{v}/render/masks/{n}.png",
                        f"data/{v}/render/depth/{n}.exr", f"{stem}_g16.png", f"{stem}_zh.exr"])
            raw[fid] = {"rgb": np.moveaxis(fr.rgb, 2, 0), "mask": fr.mask[None], "g16": g16[None], "zh": zh[None]}
    ref = base / "ref.ps"
    patchstore.ingest_images(ref, manifest=base / "manifest.csv", durable=False, progress=False)
    return base, raw, ref


def windows(rng, n=24):
    hs = rng.integers(1, H + 1, n)
    ws = rng.integers(1, W + 1, n)
    return [(int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1)), int(h), int(w)) for h, w in zip(hs, ws)]


def expect(ref_values, half):
    return ref_values.astype(np.float16).astype(np.float32) if half else ref_values


def check_view(view, ref_values, raw_values, half):
    """store[...] gives float32 (normalised) or the stored dtype: raw source values for integer records."""
    a = np.asarray(view)
    if a.dtype == np.float32:
        np.testing.assert_array_equal(a.view(np.uint32), expect(ref_values, half).view(np.uint32))
    elif a.dtype == np.float16:
        np.testing.assert_array_equal(a.astype(np.float32), expect(ref_values, True))
    else:
        assert raw_values is not None, a.dtype
        np.testing.assert_array_equal(a, raw_values)


@pytest.mark.parametrize("layout, tile, encoding, halves", CONFIGS)
def test_frames_read_back_as_the_float32_rows(tmp_path, sources, layout, tile, encoding, halves):
    base, raw, ref_path = sources
    store = tmp_path / "s.ps"
    patchstore.ingest_images(store, manifest=base / "manifest.csv", layout=layout, tile_size=tile, encoding=encoding,
                             durable=False, progress=False)
    ref, got = patchstore.open(ref_path), patchstore.open(store)
    rng = np.random.default_rng(0)
    for fid in raw:
        for field in ("rgb", "mask", "depth", "g16", "zh"):
            half = field in halves
            want = np.asarray(ref[fid][field])
            check_view(got[fid][field], want, raw[fid].get(field), half)
            wins = windows(rng)
            ys, xs = [min(y, H - 8) for y, _, _, _ in wins], [min(x, W - 8) for _, x, _, _ in wins]
            for (y, x, h, w) in wins[:6]:
                a = got.read_patches([fid], field, [y], [x], h, w)
                b = ref.read_patches([fid], field, [y], [x], h, w)
                np.testing.assert_array_equal(a.view(np.uint32), expect(b, half).view(np.uint32))
            a = got.read_patches(fid, field, ys, xs, 8, 8, num_threads=2)
            b = ref.read_patches(fid, field, ys, xs, 8, 8)
            np.testing.assert_array_equal(a.view(np.uint32), expect(b, half).view(np.uint32))
    # The sampler's masked windows: the same windows and values as from the float32 rows.
    fields = ["rgb", "mask", "depth"]
    sa = patchstore.PatchSampler(got, fields, 16, require="mask", seed=3, num_threads=2)
    sb = patchstore.PatchSampler(ref, fields, 16, require="mask", seed=3)
    ba, bb = sa.batch(8), sb.batch(8)
    for field in ("rgb", "mask", "depth"):
        np.testing.assert_array_equal(np.asarray(ba[field]).view(np.uint32),
                                      expect(np.asarray(bb[field]), field in halves).view(np.uint32))


@pytest.mark.parametrize("encoding, halves", [("compact", ()), ({"*": "compact", "F": "float16"}, ("F",))])
def test_volumes_read_back_as_the_float32_rows(tmp_path, encoding, halves):
    rng = np.random.default_rng(2)
    data = {
        "U8": rng.integers(0, 256, (9, 7, 5), dtype=np.uint8),
        "I8": rng.integers(-128, 128, (9, 7, 5), dtype=np.int8),
        "I16": rng.integers(-32768, 32768, (9, 7, 5), dtype=np.int16),
        "U16": rng.integers(0, 65536, (9, 7, 5), dtype=np.uint16),
        "F": rng.standard_normal((9, 7, 5)).astype(np.float32),
    }
    with h5py.File(tmp_path / "v.h5", "w") as f:
        for g, v in data.items():
            f[f"{g}/p1"] = v
    groups = list(data)
    norm = {"I16": "range:-1024,3000", "U16": "symmetric"}
    patchstore.ingest_hdf5(tmp_path / "v.h5", tmp_path / "ref.ps", groups, norm=norm, masks=["U8"], durable=False,
                           progress=False)
    patchstore.ingest_hdf5(tmp_path / "v.h5", tmp_path / "c.ps", groups, norm=norm, masks=["U8"], encoding=encoding,
                           durable=False, progress=False)
    ref, got = patchstore.open(tmp_path / "ref.ps"), patchstore.open(tmp_path / "c.ps")
    for g, v in data.items():
        half = g in halves
        want = np.asarray(ref["p1"][g])
        check_view(got["p1"][g], want, np.moveaxis(v, 2, 0), half)
        for k in range(5):
            a = np.asarray(got.slice("p1", g, k))
            if a.dtype == np.float32:
                np.testing.assert_array_equal(a.view(np.uint32),
                                              expect(np.asarray(ref.slice("p1", g, k)), half).view(np.uint32))
        a = got.read_patches("p1", g, [0, 2], [0, 1], 5, 4)
        b = ref.read_patches("p1", g, [0, 2], [0, 1], 5, 4)
        np.testing.assert_array_equal(a.view(np.uint32), expect(b, half).view(np.uint32))


def test_info_shows_compact_tiled_fields(tmp_path, sources, cli):
    if cli is None:
        pytest.skip("the patchstore program is not built")
    base, _, _ = sources
    store = tmp_path / "s.ps"
    patchstore.ingest_images(store, manifest=base / "manifest.csv", layout="tiles", tile_size=16,
                             encoding={"*": "compact", "zh": "float32"}, durable=False, progress=False)
    out = subprocess.run([cli, "info", str(store), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {f["name"]: (f["dtype"], f["layout"], f["tile_size"]) for f in json.loads(out.stdout)["fields"]}
    assert got == {"rgb": ("uint8", "tiles", 16), "mask": ("uint8", "tiles", 16), "depth": ("float32", "tiles", 16),
                   "g16": ("uint16", "tiles", 16), "zh": ("float32", "tiles", 16)}
    text = subprocess.run([cli, "info", str(store)], capture_output=True, text=True, timeout=60).stdout
    assert "dtype=uint16 layout=tiles 16" in text, text
