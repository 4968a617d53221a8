"""patchstore.Store: zero-copy views, exact values, batch copies, errors, pickling, fork."""

from __future__ import annotations

import array
import gc
import os
import pickle
import shutil

import numpy as np
import pytest
import torch

import patchstore
from patchstore import _patchstore as C

from conftest import EMPTY_MASK_ID, H, W


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def base_chain(a):
    out = []
    b = a.base
    while b is not None:
        out.append(b)
        b = getattr(b, "base", None) if not isinstance(b, memoryview) else b.obj
    return out


# -- metadata ---------------------------------------------------------------


def test_open_len_ids_fields(frameset):
    store = patchstore.open(frameset.store)
    assert len(store) == 20
    assert list(store.ids) == sorted(frameset.frames)
    assert store.ids[0] == "video01/0001" and store.ids[-1] == "video02/0010"
    assert store.ids[1:3] == ["video01/0002", "video01/0003"]
    assert "video02/0005" in store.ids and "nope" not in store.ids
    assert store.ids.index("video02/0001") == 10
    assert store.sealed and store.no_lock and store.kind == "frames"
    f = store.fields
    assert list(f) == ["rgb", "mask", "depth"]
    assert (f["rgb"].channels, f["rgb"].shape, f["rgb"].norm) == (3, (3, H, W), "symmetric/255")
    assert (f["mask"].channels, f["mask"].shape, f["mask"].is_mask) == (1, (1, H, W), True)
    assert (f["depth"].channels, f["depth"].shape, f["depth"].source_type) == (1, (1, H, W), "float32")
    assert store.shape("video01/0003", "depth") == (1, H, W)
    assert store.path == os.path.abspath(frameset.store)
    assert "20 samples" in repr(store)


# -- values -----------------------------------------------------------------


def test_values_equal_written_pixels(frameset):
    store = patchstore.open(frameset.store)
    for i, sid in enumerate(store.ids):
        exp = frameset.frames[sid].expected()
        by_id, by_index = store[sid], store[i]
        for name in ("rgb", "mask", "depth"):
            a = by_id[name]
            assert a.dtype == np.float32 and a.shape == exp[name].shape
            np.testing.assert_array_equal(bits(a), bits(exp[name]))  # bit-exact
            np.testing.assert_array_equal(bits(by_index[name]), bits(exp[name]))
        assert set(np.unique(by_id["mask"])) <= {0.0, 1.0}
        assert by_id["rgb"].min() >= -1 and by_id["rgb"].max() <= 1
    assert store[EMPTY_MASK_ID]["mask"].max() == 0
    assert store[-1]["depth"][0, 0, 0] == np.float32(1e-30)


def test_patch_is_a_view_with_exact_values(frameset):
    store = patchstore.open(frameset.store)
    sid = "video01/0007"
    exp = frameset.frames[sid].expected()
    p = store.patch(sid, "rgb", 5, 9, 16, 20)
    assert p.shape == (3, 16, 20) and not p.flags.writeable and not p.flags.c_contiguous
    np.testing.assert_array_equal(bits(p), bits(exp["rgb"][:, 5:21, 9:29]))
    # Corner windows are inside; one pixel further is not.
    np.testing.assert_array_equal(store.patch(sid, "depth", H - 4, W - 4, 4, 4), exp["depth"][:, -4:, -4:])
    with pytest.raises(IndexError):
        store.patch(sid, "depth", H - 3, W - 4, 4, 4)


# -- zero copy ----------------------------------------------------------------


def test_zero_copy_views(frameset):
    store = patchstore.open(frameset.store)
    whole = store["video01/0002"]["rgb"]
    again = store.get(1, "rgb")
    patch = store.patch(1, "rgb", 3, 4, 8, 8)
    # No copy: all three point at the same bytes of the memory map.
    assert np.shares_memory(whole, again) and np.shares_memory(whole, patch)
    assert whole.__array_interface__["data"][0] == again.__array_interface__["data"][0]
    assert patch.__array_interface__["data"][0] == whole.__array_interface__["data"][0] + (3 * W + 4) * 4
    assert whole.__array_interface__["data"][0] % 16 == 0  # payloads are 16-byte aligned in the map
    # The base chain holds the C++ view object that owns the snapshot.
    assert any(isinstance(b, C.View) for b in base_chain(whole))
    assert any(isinstance(b, C.View) for b in base_chain(patch))
    # Read-only.
    assert not whole.flags.writeable
    with pytest.raises(ValueError):
        whole[0, 0, 0] = 1.0
    with pytest.raises(ValueError):
        whole.setflags(write=True)
    # Different records do not overlap.
    assert not np.shares_memory(whole, store.get(2, "rgb"))


def test_views_carry_the_stored_dtype(frameset):
    # The buffer export takes its element size and format character from the
    # view's dtype (the record's), not a hard-coded "f".
    r = C.Reader.open(frameset.store)
    for view in (r.get(0, "rgb"), r.patch(0, "rgb", 1, 2, 3, 4), r.get(0, "mask")):
        m = memoryview(view)
        assert view.dtype == "float32"
        assert (m.format, m.itemsize) == ("f", 4)
        assert np.dtype(m.format) == np.dtype(view.dtype)
        a = np.asarray(view)
        assert a.dtype == np.float32
        assert a.strides[-1] == 4
        assert repr(view).startswith("<patchstore View float32 (")
    assert [f["dtype"] for f in r.fields()] == ["float32"] * len(r.fields())
    assert r.header(0, "rgb")["dtype"] == "float32"
    assert r.summary(0, "rgb")["dtype"] == "float32"
    store = patchstore.open(frameset.store)
    assert {f.dtype for f in store.fields.values()} == {"float32"}
    assert store["video01/0002"]["rgb"].dtype == np.float32


def test_views_outlive_store(frameset):
    exp = frameset.frames["video02/0003"].expected()
    store = patchstore.open(frameset.store)
    arrays = store["video02/0003"]
    patch = store.patch("video02/0003", "depth", 1, 2, 10, 11)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store["video02/0003"]
    del store
    gc.collect()
    # A second store opened and dropped in between must not disturb the old snapshot.
    other = patchstore.open(frameset.store)
    _ = other[0]
    del other
    gc.collect()
    for name in ("rgb", "mask", "depth"):
        np.testing.assert_array_equal(bits(arrays[name]), bits(exp[name]))
    np.testing.assert_array_equal(bits(patch), bits(exp["depth"][:, 1:11, 2:13]))


# -- read_patches ---------------------------------------------------------------


def test_read_patches_into_numpy(frameset):
    store = patchstore.open(frameset.store)
    keys = ["video01/0001", 3, "video02/0009", -1]
    ys, xs = [0, 10, 32, 5], [0, 20, 48, 7]
    out = np.full((4, 3, 16, 16), np.nan, dtype=np.float32)
    got = store.read_patches(keys, "rgb", ys, xs, 16, 16, out=out)
    assert got is out
    ids = list(store.ids)
    for j, k in enumerate(keys):
        sid = k if isinstance(k, str) else ids[k]
        exp = frameset.frames[sid].expected()["rgb"][:, ys[j]:ys[j] + 16, xs[j]:xs[j] + 16]
        np.testing.assert_array_equal(bits(out[j]), bits(exp))
    # Allocating, one key broadcast over many corners, numpy index arrays, threads.
    a = store.read_patches("video01/0005", "depth", np.arange(5), np.arange(5) * 2, 8, 9)
    assert a.shape == (5, 1, 8, 9) and a.flags.c_contiguous and a.flags.writeable
    exp = frameset.frames["video01/0005"].expected()["depth"]
    for j in range(5):
        np.testing.assert_array_equal(bits(a[j]), bits(exp[:, j:j + 8, 2 * j:2 * j + 9]))
    b = store.read_patches(np.full(5, 4), "depth", np.arange(5), np.arange(5) * 2, 8, 9, num_threads=3)
    np.testing.assert_array_equal(bits(a), bits(b))
    # Any writable float32 buffer works: array('f').
    buf = array.array("f", bytes(4 * 2 * 1 * 4 * 4))
    store.read_patches([0, 1], "mask", [0, 0], [0, 0], 4, 4, out=buf)
    np.testing.assert_array_equal(np.frombuffer(buf, np.float32).reshape(2, 1, 4, 4),
                                  np.stack([store.get(0, "mask")[:, :4, :4], store.get(1, "mask")[:, :4, :4]]))
    # An empty request is fine.
    assert store.read_patches([], "rgb", [], [], 4, 4).shape == (0, 3, 4, 4)


def test_read_patches_into_torch(frameset):
    store = patchstore.open(frameset.store)
    out = torch.full((3, 1, 12, 12), float("nan"))
    got = store.read_patches([0, 1, 2], "depth", [1, 2, 3], [4, 5, 6], 12, 12, out=out)
    assert got is out
    ids = list(store.ids)
    for j in range(3):
        exp = frameset.frames[ids[j]].expected()["depth"][:, 1 + j:13 + j, 4 + j:16 + j]
        np.testing.assert_array_equal(bits(out[j].numpy()), bits(exp))
    # A tensor that requires grad is written through .detach().
    g = torch.zeros((1, 3, 4, 4), requires_grad=True)
    store.read_patches(0, "rgb", 0, 0, 4, 4, out=g)
    np.testing.assert_array_equal(g.detach().numpy()[0], store.patch(0, "rgb", 0, 0, 4, 4))
    if torch.cuda.is_available():  # pinned memory needs an accelerator
        pinned = torch.empty((2, 3, 8, 8)).pin_memory()
        store.read_patches([0, 1], "rgb", [0, 1], [0, 1], 8, 8, out=pinned)
        np.testing.assert_array_equal(pinned[1].numpy(), store.patch(1, "rgb", 1, 1, 8, 8))
    with pytest.raises(ValueError, match="float32"):
        store.read_patches([0], "rgb", [0], [0], 4, 4, out=torch.zeros((1, 3, 4, 4), dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        store.read_patches([0], "rgb", [0], [0], 4, 4, out=torch.zeros((1, 3, 4, 8))[..., ::2])


def test_read_patches_checks_out(frameset):
    store = patchstore.open(frameset.store)
    ro = np.zeros((1, 3, 4, 4), np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="writable"):
        store.read_patches([0], "rgb", [0], [0], 4, 4, out=ro)
    with pytest.raises(ValueError, match="writable"):
        store.read_patches([0], "rgb", [0], [0], 4, 4, out=b"x" * 192)
    with pytest.raises(ValueError, match="float32"):
        store.read_patches([0], "rgb", [0], [0], 4, 4, out=np.zeros((1, 3, 4, 4), np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        store.read_patches([0], "rgb", [0], [0], 4, 4, out=np.zeros((1, 3, 4, 8), np.float32)[..., ::2])
    with pytest.raises(ValueError, match="needs 48"):
        store.read_patches([0], "rgb", [0], [0], 4, 4, out=np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(ValueError, match="expected"):
        store.read_patches([0], "rgb", [0], [0], 4, 4, out=np.zeros((1, 3, 2, 8), np.float32))
    with pytest.raises(ValueError, match="broadcast"):
        store.read_patches([0, 1], "rgb", [0, 1, 2], [0], 4, 4)
    # Nothing is written when one window is bad.
    out = np.full((2, 3, 4, 4), 7.0, np.float32)
    with pytest.raises(IndexError, match="video01/0002"):
        store.read_patches([0, 1], "rgb", [0, H - 3], [0, 0], 4, 4, out=out)
    assert (out == 7.0).all()


# -- errors -------------------------------------------------------------------


def test_error_types_and_messages(frameset, tmp_path):
    store = patchstore.open(frameset.store)
    path = store.path
    with pytest.raises(FileNotFoundError, match="no such directory"):
        patchstore.open(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="data.mdb"):
        patchstore.open(tmp_path / "empty")
    with pytest.raises(KeyError) as e:
        store["video09/0001"]
    assert "video09/0001" in str(e.value) and path in str(e.value)
    with pytest.raises(KeyError) as e:
        store.get("video01/0001", "normals")
    assert "normals" in str(e.value) and path in str(e.value) and "rgb" in str(e.value)
    with pytest.raises(IndexError, match=r"20.*" + path.replace("/", ".")):
        store[20]
    with pytest.raises(IndexError):
        store[-21]
    with pytest.raises(IndexError) as e:
        store.patch("video01/0003", "mask", 40, 0, 16, 16)
    assert "video01/0003" in str(e.value) and "'mask'" in str(e.value) and path in str(e.value)
    with pytest.raises(ValueError, match="positive"):
        store.patch("video01/0003", "mask", 0, 0, 0, 16)
    with pytest.raises(IndexError):
        store.read_patches([25], "rgb", [0], [0], 4, 4)
    with pytest.raises(TypeError):
        store[1.5]
    assert 3.5 not in store and "video01/0001" in store and b"video01/0001" in store


def test_status_translation_table():
    # patchstore::Code values, in declaration order (store/status.h).
    NotFound, OutOfRange, InvalidArgument, IOError_, Corruption, Unsupported, AlreadyExists, Aborted, Internal = \
        range(1, 10)
    expect = {
        NotFound: KeyError, OutOfRange: IndexError, InvalidArgument: ValueError, IOError_: OSError,
        Corruption: patchstore.CorruptRecordError, Unsupported: ValueError, AlreadyExists: FileExistsError,
        Aborted: RuntimeError, Internal: RuntimeError,
    }
    for code, exc in expect.items():
        with pytest.raises(exc) as e:
            C._raise_status(code, f"message {code}")
        assert type(e.value) is exc
        assert f"message {code}" in str(e.value)
    with pytest.raises(FileNotFoundError):
        C._raise_status(NotFound, "x", files=True)
    assert issubclass(patchstore.CorruptRecordError, OSError)


def _find_payload(data: bytes, payload: bytes) -> int:
    at = data.find(payload)
    assert at > 0 and data.find(payload, at + 1) < 0
    return at


def test_corrupt_records(frameset, tmp_path):
    bad = tmp_path / "bad.ps"
    shutil.copytree(frameset.store, bad)
    store = patchstore.open(frameset.store)
    depth = store.get("video01/0004", "depth").tobytes()
    rgb = store.get("video02/0002", "rgb").tobytes()
    del store
    data = bytearray((bad / "data.mdb").read_bytes())
    d_at = _find_payload(bytes(data), depth)
    r_at = _find_payload(bytes(data), rgb)
    data[d_at - 112 + 40] ^= 0x01  # inside the 112-byte header: its checksum no longer matches
    data[r_at + 1000] ^= 0x40  # inside the payload: only the body checksum notices
    (bad / "data.mdb").write_bytes(bytes(data))

    s = patchstore.open(bad)
    with pytest.raises(patchstore.CorruptRecordError) as e:
        s["video01/0004"]
    msg = str(e.value)
    assert "video01/0004" in msg and "'depth'" in msg and str(bad) in msg
    assert isinstance(e.value, OSError)
    # The other fields of that sample, and the payload damage, read without checks.
    assert s.get("video01/0004", "rgb").shape == (3, H, W)
    assert s.get("video02/0002", "rgb").shape == (3, H, W)
    with pytest.raises(patchstore.CorruptRecordError, match="video01/0004.*'depth'"):
        s.verify()  # stops at the first damaged record, in index order
    with pytest.raises(patchstore.CorruptRecordError, match="video02/0002"):
        s.verify(["video02/0002"], ["rgb"])
    assert s.verify(["video02/0002"], ["depth", "mask"]) == 2
    checked = patchstore.open(bad, verify_checksums=True)
    with pytest.raises(patchstore.CorruptRecordError, match="video02/0002.*'rgb'"):
        checked.get("video02/0002", "rgb")
    np.testing.assert_array_equal(checked.get("video02/0001", "rgb"), s.get("video02/0001", "rgb"))
    # A truncated data file is caught when opening.
    trunc = tmp_path / "trunc.ps"
    shutil.copytree(frameset.store, trunc)
    with open(trunc / "data.mdb", "r+b") as f:
        f.truncate(len(data) // 2)
    with pytest.raises(patchstore.CorruptRecordError, match="truncated"):
        patchstore.open(trunc)


def test_os_error_for_unreadable_store(tmp_path):
    (tmp_path / "s.ps" / "data.mdb").mkdir(parents=True)  # data.mdb is a folder: LMDB cannot open it
    with pytest.raises(OSError) as e:
        patchstore.open(tmp_path / "s.ps")
    assert not isinstance(e.value, (FileNotFoundError, patchstore.CorruptRecordError))
    assert str(tmp_path / "s.ps") in str(e.value)


# -- ids that are not UTF-8 -----------------------------------------------------


def test_non_utf8_ids(tmp_path):
    from conftest import write_png

    img = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    write_png(tmp_path / "a.png", img)
    write_png(tmp_path / "b.png", img[::-1].copy())
    (tmp_path / "m.csv").write_bytes(b"id,rgb\ncaf\xe9/1,a.png\nplain,b.png\n")
    patchstore.ingest_images(tmp_path / "s.ps", manifest=tmp_path / "m.csv", durable=False)
    s = patchstore.open(tmp_path / "s.ps")
    assert list(s.ids) == ["caf\udce9/1", "plain"]
    assert s.ids[0].encode("utf-8", "surrogateescape") == b"caf\xe9/1"
    np.testing.assert_array_equal(s["caf\udce9/1"]["rgb"], s[b"caf\xe9/1"]["rgb"])
    np.testing.assert_array_equal(s[0]["rgb"], np.moveaxis(img, 2, 0).astype(np.float32) / 255 * 2 - 1)
    assert "caf\udce9/1" in s.ids and b"caf\xe9/1" in s
    with pytest.raises(KeyError):
        s["caf\xe9/1"]  # the str 'café' is UTF-8 c3 a9, a different id


# -- pickling and fork ------------------------------------------------------------


def test_pickle_is_path_and_options(frameset):
    store = patchstore.open(frameset.store, verify_checksums=True)
    blob = pickle.dumps(store)
    assert len(blob) < 400  # path and options, no data
    clone = pickle.loads(blob)
    assert clone._reader is None  # reopens lazily
    assert clone.path == store.path and clone.options == {"verify_checksums": True, "no_lock": False}
    np.testing.assert_array_equal(clone["video01/0006"]["depth"], store["video01/0006"]["depth"])
    assert clone._reader is not None
    store.close()
    assert pickle.loads(pickle.dumps(store))[0]["rgb"].shape == (3, H, W)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_store_reopens_in_forked_child(live_store):
    store = patchstore.open(live_store)
    assert not store.sealed and not store.no_lock  # a live store: reader slots in the lock table
    before = store["video01/0001"]["rgb"].copy()
    parent_reader = store._reader
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            a = store["video01/0001"]["rgb"]
            ok = (store._reader is not parent_reader and store._pid == os.getpid()
                  and np.array_equal(a, before) and not store._reader.no_lock)
            code = 0 if ok else 2
        except BaseException:
            code = 3
        finally:
            os.write(w, bytes([code]))
            os._exit(code)
    os.close(w)
    assert os.read(r, 1) == b"\x00"
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The child dropped (never used) the parent's handles: the parent still reads.
    assert store._reader is parent_reader
    np.testing.assert_array_equal(store["video01/0001"]["rgb"], before)
    np.testing.assert_array_equal(store.read_patches([0], "rgb", [0], [0], H, W)[0], before)
