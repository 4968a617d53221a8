"""Store.verify() runs the checks of `patchstore verify` (issue 31, item 6).

It used to recompute record checksums one record at a time and stop at the
first, so it passed stores the CLI reports; now, without keys and fields, it
runs the same engine (VerifyStore) and names every problem.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

import patchstore


def _flip_payload(store_dir, payload: bytes, offset: int) -> None:
    data = bytearray((store_dir / "data.mdb").read_bytes())
    at = data.find(payload)
    assert at > 0 and data.find(payload, at + 1) < 0
    data[at + offset] ^= 0x10
    (store_dir / "data.mdb").write_bytes(bytes(data))


def test_store_verify_names_every_problem_the_cli_names(frameset, tmp_path, cli):
    bad = tmp_path / "two.ps"
    shutil.copytree(frameset.store, bad)
    good = patchstore.open(frameset.store)
    assert good.verify() == len(good) * len(good.fields)
    ids = list(good.ids)
    a, b = ids[1], ids[-1]
    rgb, depth = good.get(a, "rgb").tobytes(), good.get(b, "depth").tobytes()
    del good
    _flip_payload(bad, rgb, 777)
    _flip_payload(bad, depth, 129)
    s = patchstore.open(bad)
    with pytest.raises(patchstore.CorruptRecordError) as e:
        s.verify()
    msg = str(e.value)
    assert msg.startswith("2 problem(s) found:"), msg
    assert f"'{a}' field 'rgb' in '{bad}'" in msg and f"'{b}' field 'depth' in '{bad}'" in msg, msg
    # Chosen records: the per-record check, as a read does it.
    assert s.verify([ids[0]], ["mask"]) == 1
    if cli is not None:
        r = subprocess.run([cli, "verify", str(bad)], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
        out = r.stdout + r.stderr
        assert a in out and b in out, out
