"""patchstore.ingest_images and patchstore.export from Python, and parity with the command line."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from PIL import Image

import patchstore
from patchstore import _ingest

from conftest import TEMPLATES, H, make_frames, read_exr, write_png


def store_bytes(path):
    s = patchstore.open(path)
    return {(sid, f): s.get(i, f).tobytes() for i, sid in enumerate(s.ids) for f in s.fields}


@pytest.fixture()
def small(tmp_path):
    root = tmp_path / "data"
    frames = make_frames(root, ["v1", "v2"], [1, 2], h=20, w=24, seed=3)
    return root, frames


def test_templates_resume_and_threads(small, tmp_path):
    root, frames = small
    seen = []
    s1 = patchstore.ingest_images(tmp_path / "a.ps", root=root, fields=TEMPLATES, threads=1, durable=False,
                                  progress=lambda p: seen.append((p.done, p.total)))
    assert (s1.samples_total, s1.samples_written, s1.samples_present, s1.samples_failed) == (4, 4, 0, 0)
    assert s1.bytes_written == 4 * 5 * 20 * 24 * 4 and s1.errors == []
    assert seen and seen[-1] == (4, 4)
    again = patchstore.ingest_images(tmp_path / "a.ps", root=root, fields=TEMPLATES, durable=False)
    assert (again.samples_written, again.samples_present) == (0, 4)
    # Fields given as NAME=TEMPLATE strings (as on the command line), two threads: the same store.
    patchstore.ingest_images(tmp_path / "b.ps", root=str(root), threads=2, durable=False,
                             fields=[f"{k}={v}" for k, v in TEMPLATES.items()])
    a, b = store_bytes(tmp_path / "a.ps"), store_bytes(tmp_path / "b.ps")
    assert a == b and len(a) == 12
    store = patchstore.open(tmp_path / "a.ps")
    assert store.sealed and list(store.ids) == ["v1/0001", "v1/0002", "v2/0001", "v2/0002"]
    for sid, fr in frames.items():
        for name, exp in fr.expected().items():
            np.testing.assert_array_equal(store[sid][name].view(np.uint32), exp.view(np.uint32))
    assert "ingest_images" in str(store.attributes)


def test_manifest_masks_and_norm(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 256, (6, 7, 3), dtype=np.uint8)
    sel = np.array([[0, 7, 255, 0, 1, 0, 0]] * 6, dtype=np.uint8)
    write_png(tmp_path / "in" / "rgb.png", rgb)
    write_png(tmp_path / "in" / "sel.png", sel)
    (tmp_path / "in" / "m.csv").write_text("id,rgb,sel\nonly,rgb.png,sel.png\n")
    patchstore.ingest_images(tmp_path / "s.ps", manifest=tmp_path / "in" / "m.csv", masks=["sel"],
                             norm={"rgb": "unit"}, durable=False)
    s = patchstore.open(tmp_path / "s.ps")
    assert s.fields["sel"].is_mask and s.fields["rgb"].norm.startswith("unit")
    np.testing.assert_array_equal(s["only"]["sel"][0], (sel != 0).astype(np.float32))
    np.testing.assert_array_equal(s["only"]["rgb"], np.moveaxis(rgb, 2, 0).astype(np.float32) / 255)


def test_on_error_skip_and_stop(small, tmp_path):
    root, _ = small
    broken = root / "v2" / "render" / "depth" / "0001.exr"
    broken.write_bytes(b"v/1\x01 broken exr")
    report = tmp_path / "errors.tsv"
    s = patchstore.ingest_images(tmp_path / "skip.ps", root=root, fields=TEMPLATES, on_error="skip",
                                 report=report, durable=False)
    assert (s.samples_written, s.samples_failed) == (3, 1)
    assert len(s.errors) == 1 and "v2/0001" in s.errors[0] and "0001.exr" in s.errors[0]
    assert report.read_text().startswith("v2/0001\t")
    store = patchstore.open(tmp_path / "skip.ps")
    assert len(store) == 3 and "v2/0001" not in store and not store.sealed
    # stop (default): raises, naming the file and the sample; what came before is committed.
    with pytest.raises(patchstore.CorruptRecordError) as e:
        patchstore.ingest_images(tmp_path / "stop.ps", root=root, fields=TEMPLATES, threads=1, durable=False)
    assert "0001.exr" in str(e.value) and "v2/0001" in str(e.value)
    assert list(patchstore.open(tmp_path / "stop.ps").ids) == ["v1/0001", "v1/0002"]


def test_ingest_argument_errors(small, tmp_path):
    root, _ = small
    with pytest.raises(FileNotFoundError):
        patchstore.ingest_images(tmp_path / "x.ps", root=tmp_path / "nowhere", fields=TEMPLATES)
    with pytest.raises(FileNotFoundError):
        patchstore.ingest_images(tmp_path / "x.ps", manifest=tmp_path / "nowhere.csv")
    with pytest.raises(ValueError, match="either"):
        patchstore.ingest_images(tmp_path / "x.ps")
    with pytest.raises(ValueError, match="either"):
        patchstore.ingest_images(tmp_path / "x.ps", manifest="m.csv", root=root, fields=TEMPLATES)
    with pytest.raises(ValueError, match="fields"):
        patchstore.ingest_images(tmp_path / "x.ps", root=root)
    with pytest.raises(ValueError, match="on_error"):
        patchstore.ingest_images(tmp_path / "x.ps", root=root, fields=TEMPLATES, on_error="ignore")
    with pytest.raises(ValueError, match="NAME=TEMPLATE"):
        patchstore.ingest_images(tmp_path / "x.ps", root=root, fields=["rgb"])
    with pytest.raises(ValueError):  # a bad template, reported by the C++ ingest
        patchstore.ingest_images(tmp_path / "x.ps", root=root, fields={"rgb": "{video/x.png"})


def test_progress_exception_is_raised_after_ingest(small, tmp_path):
    root, _ = small
    calls = []

    def progress(p):
        calls.append(p.done)
        raise RuntimeError("stop reporting")

    with pytest.raises(RuntimeError, match="stop reporting"):
        patchstore.ingest_images(tmp_path / "p.ps", root=root, fields=TEMPLATES, progress=progress, durable=False)
    assert len(calls) == 1  # not called again after it raised
    assert len(patchstore.open(tmp_path / "p.ps")) == 4  # the ingest itself finished


def test_ingest_releases_the_gil(tmp_path):
    root = tmp_path / "data"
    make_frames(root, ["v"], range(1, 9), h=480, w=640, seed=2)
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        s = patchstore.ingest_images(tmp_path / "g.ps", root=root, fields=TEMPLATES, threads=1, durable=False)
    finally:
        done.set()
        t.join()
    assert s.samples_written == 8
    assert s.seconds > 0.1 and len(ticks) >= 2  # long enough for a held GIL to show
    # The Python thread kept running while C++ decoded: no gap near the ingest's whole duration.
    gaps = np.diff(ticks)
    assert gaps.max() < max(0.5 * s.seconds, 0.05)


def test_export_round_trip(frameset, tmp_path):
    out = tmp_path / "out"
    summary = patchstore.export(frameset.store, out, ids=["video01/0003", "video02/0004"])
    assert summary.files_written == 6
    for sid in ("video01/0003", "video02/0004"):
        fr = frameset.frames[sid]
        d = out / os.fsdecode(_ingest.safe_relative_path(sid.encode()))
        np.testing.assert_array_equal(np.asarray(Image.open(d / "rgb.png")), fr.rgb)
        np.testing.assert_array_equal(np.asarray(Image.open(d / "mask.png")), fr.mask)
        np.testing.assert_array_equal(read_exr(d / "depth.exr")["Z"].view(np.uint32), fr.depth.view(np.uint32))
    # One field, forced to PNG with a window: round(d / 100 * 255), clamped.
    s2 = patchstore.export(patchstore.open(frameset.store), tmp_path / "w", ids="video01/0001", fields="depth",
                           format="png", window=(0, 100))
    assert s2.files_written == 1 and s2.paths[0].endswith("depth.png")
    got = np.asarray(Image.open(s2.paths[0]))
    exp = np.clip(np.rint(frameset.frames["video01/0001"].depth.astype(np.float64) / 100 * 255), 0, 255)
    np.testing.assert_array_equal(got, exp.astype(np.uint8))


def test_export_errors(frameset, tmp_path):
    with pytest.raises(FileNotFoundError):
        patchstore.export(tmp_path / "missing.ps", tmp_path / "o")
    with pytest.raises(KeyError, match="video07/0001"):
        patchstore.export(frameset.store, tmp_path / "o", ids=["video07/0001"])
    with pytest.raises(ValueError):
        patchstore.export(frameset.store, tmp_path / "o", window=(1, 0))


def test_cli_and_python_ingest_agree(small, tmp_path, cli):
    assert cli is not None and os.path.exists(cli), "set PATCHSTORE_CLI to the patchstore program"
    root, _ = small
    args = [cli, "-q", "ingest", "images", str(tmp_path / "cli.ps"), "--root", str(root), "--no-sync"]
    for k, v in TEMPLATES.items():
        args += ["--field", f"{k}={v}"]
    subprocess.run(args, check=True)
    patchstore.ingest_images(tmp_path / "py.ps", root=root, fields=TEMPLATES, durable=False)
    assert store_bytes(tmp_path / "cli.ps") == store_bytes(tmp_path / "py.ps")
    ls = subprocess.run([cli, "ls", str(tmp_path / "py.ps")], check=True, capture_output=True, text=True)
    assert ls.stdout.split() == list(patchstore.open(tmp_path / "py.ps").ids)
    # python -m patchstore runs the same program.
    env = dict(os.environ, PATCHSTORE_CLI=cli)
    mod = subprocess.run([os.sys.executable, "-m", "patchstore", "ls", str(tmp_path / "py.ps")], env=env,
                         check=True, capture_output=True, text=True)
    assert mod.stdout == ls.stdout


INTERRUPTED_INGEST = """
import signal, sys, time
import patchstore
# A test run from a background job inherits SIGINT ignored (and Python then
# installs no handler): take Ctrl-C as an interactive user's process does.
signal.signal(signal.SIGINT, signal.default_int_handler)
templates = {templates!r}

def progress(p):
    if p.done == 5:
        print("started", flush=True)
    time.sleep(0.01)  # slow enough for the signal to arrive mid-ingest

try:
    patchstore.ingest_images(sys.argv[1], root=sys.argv[2], fields=templates, threads=1, durable=False,
                             progress=progress)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_stops_an_ingest_cleanly(tmp_path):
    root = tmp_path / "data"
    frames = make_frames(root, ["v"], range(1, 121), h=16, w=16, seed=4)
    store = tmp_path / "i.ps"
    script = tmp_path / "ingest.py"
    script.write_text(INTERRUPTED_INGEST.format(templates=TEMPLATES))
    p = subprocess.Popen([os.sys.executable, str(script), str(store), str(root)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "started"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "interrupted" in out and "finished" not in out
    # The store opens and holds a prefix of the samples, each complete.
    s = patchstore.open(store)
    n = len(s)
    assert 5 <= n < len(frames) and not s.sealed
    assert list(s.ids) == sorted(frames)[:n]
    for sid in list(s.ids)[:: max(1, n // 5)]:
        for name, exp in frames[sid].expected().items():
            np.testing.assert_array_equal(s[sid][name], exp)
    # The same call again resumes and finishes.
    again = patchstore.ingest_images(store, root=root, fields=TEMPLATES, durable=False)
    assert (again.samples_present, again.samples_written) == (n, len(frames) - n)
    assert patchstore.open(store).sealed and len(patchstore.open(store)) == len(frames)


def test_montage_is_the_cli_picture(frameset, tmp_path, cli):
    store = patchstore.open(frameset.store)
    sheet = store.montage(count=9, patch_size=16, field="rgb", overlay="mask", seed=3, flip=True)
    assert sheet.dtype == np.uint8 and sheet.ndim == 3 and sheet.shape[2] == 3
    assert sheet.shape[:2] == (3 * (16 + 2) + 2,) * 2  # 3 x 3 tiles of 16 px, 2 px gaps
    assert cli is not None and os.path.exists(cli), "set PATCHSTORE_CLI to the patchstore program"
    png = tmp_path / "m.png"
    subprocess.run([cli, "montage", frameset.store, str(png), "--count", "9", "--patch", "16", "--field", "rgb",
                    "--overlay", "mask", "--seed", "3", "--flip"], check=True, capture_output=True)
    np.testing.assert_array_equal(np.asarray(Image.open(png).convert("RGB")), sheet)
    depth = store.montage(4, 16, field="depth", window=(0, 100), tile=32, require="")
    assert depth.shape == (2 * 34 + 2, 2 * 34 + 2, 3)
    with pytest.raises(KeyError, match="normals"):
        store.montage(4, 16, field="normals")
    with pytest.raises(IndexError, match="no sample has an admissible"):
        store.montage(4, H + 1, field="rgb")
    with pytest.raises(ValueError, match="count"):
        store.montage(0)
