"""Sealed stores on read-only mounts (no lock file) and `patchstore copy` (issue 16, items 3 and 4)."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import patchstore

from conftest import TEMPLATES


def _cli(cli, *args, check=True):
    r = subprocess.run([cli, *args], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def _same_content(a: str, b: str) -> None:
    sa, sb = patchstore.open(a), patchstore.open(b)
    assert list(sa.ids) == list(sb.ids)
    for sid in sa.ids:
        for f in sa.fields:
            np.testing.assert_array_equal(sa[sid][f], sb[sid][f])


def test_sealed_store_without_lock_file_opens_without_creating_one(frameset, tmp_path):
    store = tmp_path / "copy.ps"
    shutil.copytree(frameset.store, store)
    (store / "lock.mdb").unlink(missing_ok=True)
    s = patchstore.open(store)
    assert s.sealed and s.no_lock
    s[0]["rgb"].sum()
    s.verify()
    assert not (store / "lock.mdb").exists()


def test_unsealed_store_without_lock_file_gets_its_lock_table(live_store, tmp_path):
    store = tmp_path / "live.ps"
    shutil.copytree(live_store, store)
    (store / "lock.mdb").unlink(missing_ok=True)
    s = patchstore.open(store)
    assert not s.sealed and not s.no_lock
    assert (store / "lock.mdb").exists()
    assert len(s) == 20


def _mount_ro(src: Path, target: Path) -> bool:
    """Bind-mounts src read-only on target; False when mounting is not permitted here."""
    target.mkdir()
    r = subprocess.run(["mount", "--bind", str(src), str(target)], capture_output=True, text=True)
    if r.returncode != 0:
        return False
    r = subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["umount", str(target)])
        return False
    return True


def test_sealed_store_on_a_read_only_mount_reads_without_lock_file(frameset, tmp_path, cli):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to bind-mount a folder read-only")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(frameset.store, src / "frames.ps")
    (src / "frames.ps" / "lock.mdb").unlink(missing_ok=True)
    ro = tmp_path / "ro"
    if not _mount_ro(src, ro):
        pytest.skip("mount --bind / remount,ro is not permitted in this environment (container without "
                    "CAP_SYS_ADMIN)")
    try:
        with pytest.raises(OSError):
            (ro / "probe").write_text("x")  # really read-only
        s = patchstore.open(ro / "frames.ps")
        assert s.sealed and s.no_lock and len(s) == len(frameset.frames)
        sampler = patchstore.PatchSampler(s, ["rgb", "mask"], 16, patches_per_sample=2, seed=1)
        batch = sampler.batch(8)
        expect = patchstore.PatchSampler(frameset.store, ["rgb", "mask"], 16, patches_per_sample=2, seed=1).batch(8)
        np.testing.assert_array_equal(batch["rgb"], expect["rgb"])
        assert s.verify() == 3 * len(s)
        del s, sampler, batch  # unmap before umount
        gc.collect()
        if cli:
            _cli(cli, "verify", str(ro / "frames.ps"))
            _cli(cli, "info", str(ro / "frames.ps"))
            # Writing there is refused with the OS's reason, nothing created.
            r = _cli(cli, "ingest", "images", str(ro / "new.ps"), "--root", str(frameset.root),
                     "--field", "rgb=" + TEMPLATES["rgb"], check=False)
            assert r.returncode != 0 and "new.ps" in r.stderr
        assert not (ro / "frames.ps" / "lock.mdb").exists()
        assert not (src / "frames.ps" / "lock.mdb").exists()
    finally:
        gc.collect()
        r = subprocess.run(["umount", str(ro)], capture_output=True, text=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(ro)])  # never leave the mount behind
        assert r.returncode == 0, r.stderr


def test_copy_compacts_verifies_and_refuses_existing_destination(frameset, tmp_path, cli):
    if not cli:
        pytest.skip("the patchstore program is not built")
    dst = tmp_path / "dst.ps"
    r = _cli(cli, "copy", frameset.store, str(dst))
    assert "copied" in r.stdout and f"{len(frameset.frames)} samples" in r.stdout
    assert "verify" in r.stderr  # progress
    _same_content(frameset.store, str(dst))
    assert patchstore.open(dst).sealed
    assert os.path.getsize(dst / "data.mdb") <= os.path.getsize(Path(frameset.store) / "data.mdb")
    assert not [p for p in tmp_path.iterdir() if ".copy-" in p.name]
    # An existing destination is refused and left alone.
    before = (dst / "data.mdb").read_bytes()
    r = _cli(cli, "copy", frameset.store, str(dst), check=False)
    assert r.returncode == 1 and "exists" in r.stderr
    assert (dst / "data.mdb").read_bytes() == before
    # No store at the source: clear error, nothing left behind.
    r = _cli(cli, "copy", str(tmp_path / "nothing.ps"), str(tmp_path / "d2.ps"), check=False)
    assert r.returncode == 1 and "nothing.ps" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst.ps"]
    r = _cli(cli, "copy", "--help")
    assert "Compacted" in r.stdout or "compact" in r.stdout


def test_copy_of_a_damaged_store_fails_verification_and_writes_nothing(frameset, tmp_path, cli):
    if not cli:
        pytest.skip("the patchstore program is not built")
    src = tmp_path / "bad.ps"
    shutil.copytree(frameset.store, src)
    s = patchstore.open(src)
    needle = np.ascontiguousarray(s[3]["depth"]).tobytes()[:64]
    del s
    data = bytearray((src / "data.mdb").read_bytes())
    at = data.find(needle)
    assert at > 0
    data[at + 4] ^= 0x40
    (src / "data.mdb").write_bytes(bytes(data))
    r = _cli(cli, "copy", str(src), str(tmp_path / "out.ps"), check=False)
    assert r.returncode == 3, r.stderr
    assert "failed verification" in r.stderr and "depth" in r.stderr
    assert not (tmp_path / "out.ps").exists()
    assert not [p for p in tmp_path.iterdir() if ".copy-" in p.name]
