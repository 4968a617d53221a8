"""Progress of the Python ingest: a bar on a terminal, plain lines in logs, silent with progress=False."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import patchstore

from conftest import TEMPLATES

NO_TQDM = "import sys; sys.modules['tqdm'] = None\n"  # the package's own bar, whether tqdm is installed or not


def run_child(code: str, tty: bool) -> str:
    """Runs `code` in a fresh Python with stderr (and stdout) on a pseudo-terminal or a pipe; returns its output."""
    if not tty:
        r = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    assert p.wait(timeout=120) == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def images_call(frameset, store: Path, extra: str = "") -> str:
    return (f"import patchstore\npatchstore.ingest_images({str(store)!r}, root={str(frameset.root)!r}, "
            f"fields={TEMPLATES!r}, durable=False{extra})\n")


def test_ingest_images_shows_a_bar_on_a_terminal(frameset, tmp_path):
    out = run_child(NO_TQDM + images_call(frameset, tmp_path / "a.ps"), tty=True)
    n = len(frameset.frames)
    assert f"\ringest [{'#' * 30}] {n}/{n} samples" in out, out
    assert out.endswith("0 failed \r\n") or out.endswith("0 failed \n"), repr(out[-80:])


def test_ingest_is_silent_with_progress_false(frameset, tmp_path):
    assert run_child(images_call(frameset, tmp_path / "a.ps", ", progress=False"), tty=True) == ""


def test_ingest_prints_plain_lines_in_logs(frameset, tmp_path):
    out = run_child(images_call(frameset, tmp_path / "a.ps"), tty=False)
    n = len(frameset.frames)
    lines = out.splitlines()
    assert "\r" not in out and "#" not in out
    assert lines[-1].startswith(f"ingest: {n}/{n} samples, ") and lines[-1].endswith(" s"), out
    assert ", 0 failed, " in lines[-1]


def test_ingest_again_on_a_complete_store_says_so_in_one_line(frameset, tmp_path):
    store = tmp_path / "a.ps"
    run_child(images_call(frameset, store), tty=False)
    n = len(frameset.frames)
    out = run_child(images_call(frameset, store), tty=False)
    assert out == f"ingest: all {n} samples already in '{store}': nothing to do\n", out
    assert run_child(images_call(frameset, store, ", progress=False"), tty=False) == ""


def test_ingest_uses_tqdm_when_installed(frameset, tmp_path):
    pytest.importorskip("tqdm")
    out = run_child(images_call(frameset, tmp_path / "a.ps"), tty=True)
    n = len(frameset.frames)
    assert f"{n}/{n}" in out and "samples" in out and "\r" in out, out
    assert f"[{'#' * 30}]" not in out  # tqdm's bar, not the package's


def test_callback_is_called_with_or_without_the_display(frameset, tmp_path, capfd):
    seen = []
    s = patchstore.ingest_images(tmp_path / "a.ps", root=frameset.root, fields=TEMPLATES, durable=False,
                                 progress=False, callback=lambda p: seen.append((p.done, p.total)))
    n = len(frameset.frames)
    assert s.samples_written == n and seen and seen[-1] == (n, n)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert capfd.readouterr().err == ""
    with pytest.raises(ValueError, match="callback"):
        patchstore.ingest_images(tmp_path / "b.ps", root=frameset.root, fields=TEMPLATES, progress=print,
                                 callback=print)
    with pytest.raises(ValueError, match="progress must be"):
        patchstore.ingest_images(tmp_path / "b.ps", root=frameset.root, fields=TEMPLATES, progress="yes")


def test_ingest_hdf5_shows_a_bar_on_a_terminal_and_is_silent_when_asked(tmp_path):
    src = tmp_path / "v.h5"
    with h5py.File(src, "w") as f:
        for g in ("MR", "CT"):
            for p in ("p1", "p2"):
                f.create_dataset(f"{g}/{p}", data=np.zeros((4, 4, 3), np.int16))
    call = "import patchstore\npatchstore.ingest_hdf5({!r}, {!r}, groups=('MR', 'CT'), durable=False{})\n"
    out = run_child(NO_TQDM + call.format(str(src), str(tmp_path / "a.ps"), ""), tty=True)
    assert f"\ringest hdf5 [{'#' * 30}] 2/2 volumes" in out, out
    assert run_child(call.format(str(src), str(tmp_path / "b.ps"), ", progress=False"), tty=True) == ""
