"""Stored bytes out, float32 after (the GPU feed): output="stored" gathers each field in its stored dtype, and
to_float / BatchLoader(device=...) turn it into the float32 output bit for bit, for every exact encoding.

Frames: seed-layout frames (8-bit rgb, 0/255 mask, float32 EXR depth) ingested as compact rows, compact tiles and
compact with depth=float16; volumes: int16 MR/CT and uint8 MASK, compact, with a clamp. The reference is each
store's own float32 output (the same windows), compared as bytes.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import patchstore
from patchstore.torch import BatchLoader, FloatConverter, PatchDataset, SliceDataset, collate, slice_collate, to_float

from conftest import TEMPLATES, make_frames
from test_volumes import make_volumes, write_h5

FIELDS = ["rgb", "mask", "depth"]
ENCODINGS = {
    "compact-rows": ["--encoding", "compact"],
    "compact-tiles": ["--layout", "tiles", "--tile-size", "16", "--encoding", "compact"],
    "compact-f16": ["--layout", "tiles", "--tile-size", "16", "--encoding", "compact", "--encoding", "depth=float16"],
}
STORED = {"compact-rows": (torch.uint8, torch.uint8, torch.float32),
          "compact-tiles": (torch.uint8, torch.uint8, torch.float32),
          "compact-f16": (torch.uint8, torch.uint8, torch.float16)}


@pytest.fixture(scope="module")
def frame_stores(tmp_path_factory, cli):
    base = tmp_path_factory.mktemp("stored")
    root = base / "data"
    make_frames(root, ["v1", "v2"], range(1, 4), h=61, w=83, seed=11)
    out = {}
    for name, flags in ENCODINGS.items():
        path = str(base / f"{name}.ps")
        args = [cli, "--quiet", "ingest", "images", path, "--root", str(root), "--no-sync"]
        for f, tpl in TEMPLATES.items():
            args += ["--field", f"{f}={tpl}"]
        subprocess.run(args + flags, check=True)
        out[name] = path
    return out


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()


OPTIONS = dict(patch_size=32, patches_per_sample=2, require="mask", flip=True, rot90=True, seed=7, num_threads=2)


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_batchloader_stored_batches_convert_to_the_float32_batches(frame_stores, name):
    ref = BatchLoader(frame_stores[name], FIELDS, batch_size=5, **OPTIONS)
    raw = BatchLoader(frame_stores[name], FIELDS, batch_size=5, output="stored", **OPTIONS)
    assert [patchstore.Store(frame_stores[name]).fields[f].dtype for f in FIELDS] == \
        [str(d).replace("torch.", "") for d in STORED[name]]
    n = 0
    for want, got in zip(ref.batches(3), raw.batches(3)):
        for f, dtype in zip(FIELDS, STORED[name]):
            assert got[f].dtype == dtype and got[f].shape == want[f].shape
        conv = to_float(got, raw)
        for f in FIELDS:
            assert same_bytes(conv[f], want[f]), (name, f)
        n += 1
    assert n == len(ref) > 1
    assert raw.state_dict() == ref.state_dict()  # output changes the dtype, not what is served


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_batchloader_device_cpu_gives_the_float32_batches(frame_stores, name):
    ref = BatchLoader(frame_stores[name], FIELDS, batch_size=4, **OPTIONS)
    dev = BatchLoader(frame_stores[name], FIELDS, batch_size=4, device="cpu", **OPTIONS)
    kept = []
    for want, got in zip(ref, dev):
        for f in FIELDS:
            assert got[f].dtype == torch.float32 and got[f].device.type == "cpu"
            assert same_bytes(got[f], want[f]), (name, f)
        kept.append({f: t.clone() for f, t in want.items()})
    assert len(kept) == len(ref)
    # A second epoch through the same ring: still the float32 loader's batches.
    for want, got in zip(ref, dev):
        assert all(same_bytes(got[f], want[f]) for f in FIELDS)
    stored_cpu = BatchLoader(frame_stores[name], FIELDS, batch_size=4, device="cpu", output="stored", **OPTIONS)
    first = next(iter(stored_cpu.batches(0)))
    assert [first[f].dtype for f in FIELDS] == list(STORED[name])


def test_patchdataset_stored_through_dataloader_workers(frame_stores):
    path = frame_stores["compact-f16"]
    opts = dict(patch_size=24, patches_per_sample=3, require="mask", flip=True, rot90=True, seed=3)
    ref = PatchDataset(path, FIELDS, **opts)
    raw = PatchDataset(path, FIELDS, output="stored", **opts)
    for ds in (ref, raw):
        ds.set_epoch(2)
    a = list(DataLoader(ref, batch_size=2, num_workers=2, collate_fn=collate))
    b = list(DataLoader(raw, batch_size=2, num_workers=2, collate_fn=collate))
    assert len(a) == len(b) == 3
    for want, got in zip(a, b):
        assert got["rgb"].dtype == torch.uint8 and got["depth"].dtype == torch.float16
        assert got["rgb"].shape == want["rgb"].shape == (6, 3, 24, 24)
        conv = to_float(got, raw)
        assert all(same_bytes(conv[f], want[f]) for f in FIELDS)
    # Items one by one (the training-process path) and the converter on its own.
    conv = FloatConverter(raw)
    for i in range(len(raw)):
        got, want = conv(raw[i]), ref[i]
        assert all(same_bytes(got[f], want[f]) for f in FIELDS)


def test_stored_bytes_per_window_are_what_the_store_holds(frame_stores):
    """rgb+mask+depth of 256x256: 1.31 MB as float32; 0.52 MB compact; 0.39 MB with depth=float16."""
    for name, want in (("compact-tiles", 3 + 1 + 4), ("compact-f16", 3 + 1 + 2)):
        b = next(iter(BatchLoader(frame_stores[name], FIELDS, batch_size=2, patch_size=32, output="stored").batches(0)))
        per_window = sum(t[0].numel() * t.element_size() for t in b.values())
        assert per_window == want * 32 * 32
        assert want * 256 * 256 <= {"compact-tiles": 0.53e6, "compact-f16": 0.40e6}[name]


@pytest.fixture(scope="module")
def volume_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("stored-vols")
    vols = make_volumes(np.random.default_rng(4), {"p1": (6, 20, 20), "p2": (4, 20, 20)})
    write_h5(base / "v.h5", vols)
    store = str(base / "v.ps")
    patchstore.ingest_hdf5(base / "v.h5", store, durable=False, encoding="compact",
                           norm={"MR": "affine:0.001,-1", "CT": "range:-1024,3071"})
    return store


def test_slicedataset_stored_items_convert_with_the_clamp(volume_store):
    fields = ("MR", "CT", "MASK")
    opts = dict(context=1, crop=12, flip=True, rot90=True, seed=5, clamp={"MR": (-0.5, 0.5)}, clamp_warn=None)
    ref = SliceDataset(volume_store, fields, **opts)
    raw = SliceDataset(volume_store, fields, output="stored", **opts)
    dtypes = [patchstore.Store(volume_store).fields[f].dtype for f in fields]
    assert dtypes == ["int16", "int16", "uint8"]
    a = list(DataLoader(ref, batch_size=3, num_workers=2, collate_fn=slice_collate))
    b = list(DataLoader(raw, batch_size=3, num_workers=2, collate_fn=slice_collate))
    assert len(a) == len(b) == 4
    clamped = 0
    for want, got in zip(a, b):
        assert [t.dtype for t in got] == [torch.int16, torch.int16, torch.uint8]
        conv = to_float(got, raw)
        assert all(same_bytes(c, w) for c, w in zip(conv, want))
        clamped += int((want[0] == 0.5).sum())
    assert clamped > 0  # the clamp was applied to the converted MR
    for i in (0, 5, 9):
        assert all(same_bytes(c, w) for c, w in zip(to_float(raw[i], raw), ref[i]))


def test_bad_outputs_devices_and_buffers_are_refused(frame_stores):
    path = frame_stores["compact-tiles"]
    with pytest.raises(ValueError, match="output must be 'float32' or 'stored'"):
        BatchLoader(path, FIELDS, batch_size=2, patch_size=16, output="uint8")
    with pytest.raises(ValueError, match="output must be"):
        PatchDataset(path, FIELDS, patch_size=16, output="half")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch.cuda.is_available"):
            BatchLoader(path, FIELDS, batch_size=2, patch_size=16, device="cuda")
    with pytest.raises(ValueError, match="device must be"):
        BatchLoader(path, FIELDS, batch_size=2, patch_size=16, device="tpu")
    s = patchstore.PatchSampler(path, ["rgb"], patch_size=16)
    wins = np.zeros((1, 6), dtype=np.int64)
    with pytest.raises(ValueError, match=r"float32 or uint8 \(the field's stored dtype\)"):
        s._s().gather_windows(wins, [np.empty((1, 3, 16, 16), dtype=np.uint16)])
    conv = FloatConverter(path, ["rgb"])
    with pytest.raises(TypeError, match="stored as torch.uint8, got a torch.int16"):
        conv(torch.zeros((1, 3, 4, 4), dtype=torch.int16))
    x = torch.rand(1, 3, 4, 4)
    assert conv(x) is x  # float32 already: returned as is
    reader = conv._reader
    with pytest.raises(ValueError, match=r"src must be a C-contiguous buffer of uint8"):
        reader.convert_stored("rgb", np.zeros(8, dtype=np.uint16), np.empty(8, dtype=np.float32))
    with pytest.raises(ValueError, match=r"dst has shape \(7,\), expected \(8,\)"):
        reader.convert_stored("rgb", np.zeros(8, dtype=np.uint8), np.empty(7, dtype=np.float32))
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        reader.convert_stored("rgb", np.zeros(8, dtype=np.uint8), np.empty(8, dtype=np.float32), 0)


@pytest.mark.parametrize("threads", [1, 3])
def test_cpu_conversion_reuses_only_buffers_nobody_holds(frame_stores, threads):
    """to_float on the CPU converts in C++ into reused buffers: a batch still held is never overwritten by the
    next conversion, and the thread count does not change a bit."""
    name = "compact-f16"
    ref = BatchLoader(frame_stores[name], FIELDS, batch_size=3, **OPTIONS)
    raw = BatchLoader(frame_stores[name], FIELDS, batch_size=3, output="stored", **OPTIONS)
    conv = FloatConverter(raw, convert_threads=threads)
    want = [{f: t.clone() for f, t in b.items()} for b in ref.batches(4)]
    held = [conv({f: t.clone() for f, t in b.items()}) for b in raw.batches(4)]
    assert len(held) == len(want) > 2
    for w, g in zip(want, held):
        assert all(same_bytes(g[f], w[f]) for f in FIELDS)
    # Once dropped, buffers come back: converting again allocates nothing new for rgb.
    ptrs = {held[0]["rgb"].data_ptr()}
    del held
    again = [conv({f: t.clone() for f, t in b.items()})["rgb"].data_ptr() for b in raw.batches(4)]
    assert set(again) & ptrs or len(set(again)) < len(again)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (bench/gpu/run.sh runs it there)")
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_batchloader_device_cuda_gives_the_float32_batches_bit_for_bit(frame_stores, name):
    """Stored bytes copied on the side stream and converted on the GPU, behind a slow kernel on the current
    stream: every batch equals the CPU float32 batch, so no ring slot was refilled before its copy ended."""
    ref = BatchLoader(frame_stores[name], FIELDS, batch_size=4, **OPTIONS)
    dev = BatchLoader(frame_stores[name], FIELDS, batch_size=4, device="cuda", buffers=2, **OPTIONS)
    want = [{f: t.clone() for f, t in b.items()} for b in ref.batches(1)]
    got = []
    for b in dev.batches(1):
        torch.cuda._sleep(20_000_000)  # keeps the device busy while the loader refills its two slots
        got.append(b)
    torch.cuda.synchronize()
    assert len(got) == len(want) > 2
    for w, g in zip(want, got):
        for f in FIELDS:
            assert g[f].device.type == "cuda" and g[f].dtype == torch.float32
            assert same_bytes(g[f].cpu(), w[f]), (name, f)
    # The DataLoader-style path: stored items converted on the device by to_float.
    raw = BatchLoader(frame_stores[name], FIELDS, batch_size=4, output="stored", **OPTIONS)
    for w, b in zip(want, raw.batches(1)):
        conv = to_float(b, raw, device="cuda")
        assert all(same_bytes(conv[f].cpu(), w[f]) for f in FIELDS)
