"""patchstore.copy (issue 29 item 2): the compacting copy and the conversion of a store from its records, and
the store size projected before an ingest writes."""
import os
import subprocess
import sys

import numpy as np
import pytest

import patchstore

from conftest import TEMPLATES


def _same_reads(a, b):
    sa, sb = patchstore.open(a), patchstore.open(b)
    assert list(sa.ids) == list(sb.ids)
    assert list(sa.fields) == list(sb.fields)
    for i in range(len(sb)):
        for f in sb.fields:
            x, y = np.asarray(sa[i][f], dtype=np.float32), np.asarray(sb[i][f], dtype=np.float32)
            assert x.shape == y.shape and x.tobytes() == y.tobytes(), (i, f)


def test_copy_converts_rows_float32_to_tiles_compact_and_back(frameset, tmp_path, capfd):
    s = patchstore.copy(frameset.store, tmp_path / "t.ps", layout="tiles", tile_size=16, encoding="compact",
                        progress=False)
    assert s.converted and s.samples == len(frameset.frames) and s.dst_bytes < s.src_bytes
    t = patchstore.open(tmp_path / "t.ps")
    assert {f: (info.dtype, info.tile) for f, info in t.fields.items()} == {
        "rgb": ("uint8", 16), "mask": ("uint8", 16), "depth": ("float32", 16)}
    assert {info.tile for info in patchstore.open(frameset.store).fields.values()} == {0}  # rows
    assert t.sealed
    _same_reads(tmp_path / "t.ps", frameset.store)
    back = patchstore.copy(tmp_path / "t.ps", tmp_path / "r.ps", layout="rows", encoding={"*": "float32"},
                           progress=False)
    assert back.converted and back.dst_bytes > back.src_bytes
    assert {(i.dtype, i.tile) for i in patchstore.open(tmp_path / "r.ps").fields.values()} == {("float32", 0)}
    _same_reads(tmp_path / "r.ps", frameset.store)
    assert capfd.readouterr().err == ""  # progress=False
    assert not [p for p in tmp_path.iterdir() if ".copy-" in p.name]


def test_copy_without_options_is_the_compacting_copy_and_reports_progress(frameset, tmp_path):
    seen = []
    s = patchstore.copy(frameset.store, tmp_path / "c.ps", progress=False, callback=seen.append)
    assert not s.converted and s.records >= s.samples == len(frameset.frames)
    assert [p.message for p in seen] == [f"copy: writing a compacted copy of '{frameset.store}'..."]
    _same_reads(tmp_path / "c.ps", frameset.store)
    seen.clear()
    patchstore.copy(frameset.store, tmp_path / "h.ps", encoding={"depth": "float16"}, progress=False,
                    callback=seen.append)
    assert seen[0].message.startswith(f"copy: re-laying out and re-encoding '{frameset.store}'")
    assert "depth float32 rows -> float16 rows" in seen[0].message
    steps = [p for p in seen if not p.message]
    assert steps[-1].done == steps[-1].total == len(frameset.frames)
    h = patchstore.open(tmp_path / "h.ps")
    ref = patchstore.open(frameset.store)
    for i in range(len(ref)):
        np.testing.assert_array_equal(np.asarray(h[i]["depth"]),
                                      np.asarray(ref[i]["depth"]).astype(np.float16).astype(np.float32))


def test_copy_refuses_what_it_cannot_do(frameset, tmp_path):
    (tmp_path / "exists.ps").mkdir()
    with pytest.raises(FileExistsError, match="exists"):
        patchstore.copy(frameset.store, tmp_path / "exists.ps", layout="tiles")
    with pytest.raises(FileNotFoundError):
        patchstore.copy(tmp_path / "nothing.ps", tmp_path / "d.ps", layout="tiles")
    with pytest.raises(ValueError, match="tile_size=32 is for layout='tiles'"):
        patchstore.copy(frameset.store, tmp_path / "d.ps", tile_size=32)
    with pytest.raises(ValueError, match="--encoding names field 'nope'"):
        patchstore.copy(frameset.store, tmp_path / "d.ps", encoding={"nope": "compact"}, progress=False)
    half = tmp_path / "half.ps"
    patchstore.copy(frameset.store, half, encoding={"rgb": "float16"}, progress=False)
    with pytest.raises(ValueError, match=r"sample '\S+': field 'rgb' cannot be stored as uint8"):
        patchstore.copy(half, tmp_path / "d.ps", encoding="compact", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists.ps", "half.ps"]


def test_ingest_reports_the_projected_size_and_advice(frameset, tmp_path):
    code = (f"import patchstore\ns = patchstore.ingest_images({str(tmp_path / 'a.ps')!r}, "
            f"root={str(frameset.root)!r}, fields={TEMPLATES!r}, durable=False)\n"
            "print(s.projected_bytes, s.ram_bytes, repr(s.advice))\n")
    env = dict(os.environ, PATCHSTORE_ASSUME_RAM_BYTES="1000000")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    projected, ram, advice = r.stdout.split(maxsplit=2)
    assert int(ram) == 1000000
    real = os.path.getsize(tmp_path / "a.ps" / "data.mdb")
    assert abs(int(projected) / real - 1) < 0.03
    assert advice.strip() == "'--layout tiles --encoding compact --encoding depth=float16'"
    assert "ingest: projected store size" in r.stderr and "served best by --layout tiles" in r.stderr
    # progress=False: nothing printed, the summary still says it.
    code = code.replace("durable=False", "durable=False, progress=False").replace("a.ps", "b.ps")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "--layout tiles" in r.stdout
