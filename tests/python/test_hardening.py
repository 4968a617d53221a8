"""What a hostile-input sweep found (issue 14): no crash, hang or silent wrong result.

Each test names the item of the issue it pins. CLI cases run the built
program with a timeout, so a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import patchstore

from conftest import TEMPLATES, make_frames


def run_cli(cli, *args, timeout=30):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def run_python(code: str, timeout=60):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture()
def small_frames(tmp_path):
    root = tmp_path / "data"
    frames = make_frames(root, ["v1"], range(1, 3))
    return root, frames


# ---- 1. montage sizes are checked up front ---------------------------------------------------------------

def test_montage_too_large_is_refused_with_sizes(cli, frameset, tmp_path):
    r = run_cli(cli, "montage", frameset.store, tmp_path / "m.png", "--count", 4096, "--patch", 64, "--tile", 4096)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "262274x262274 pixels" in r.stderr and "2^29" in r.stderr, r.stderr
    assert not (tmp_path / "m.png").exists()


def test_montage_too_large_raises_value_error(frameset):
    store = patchstore.open(frameset.store)
    with pytest.raises(ValueError, match=r"262274x262274 pixels"):
        store.montage(count=4096, patch_size=16, tile=4096)
    # Too many float32 windows, known before the store is opened: 4096 x 1024 x 1024 x 4 bytes.
    with pytest.raises(ValueError, match=r"4096 windows of 1024x1024 \(1 channels\) need 16384 MiB of float32"):
        store.montage(count=4096, patch_size=1024, field="rgb", tile=8)
    # ... and once the field's channels are known: 4096 x 3 x 300 x 300 x 4 bytes.
    with pytest.raises(ValueError, match=r"\(3 channels\) need 4218 MiB of float32, more than the limit of 4096"):
        store.montage(count=4096, patch_size=300, field="rgb", tile=8)


# ---- 3. writing through a tensor made from a read-only view -----------------------------------------------

def test_write_through_read_only_view_does_not_crash_or_change_the_store(frameset):
    torch = pytest.importorskip("torch")
    del torch
    sid = next(iter(frameset.frames))
    want = frameset.frames[sid].expected()["rgb"]
    r = run_python(f"""
        import warnings
        import numpy as np, torch, patchstore
        s = patchstore.open({frameset.store!r})
        a = np.asarray(s[{sid!r}]["rgb"])
        assert not a.flags.writeable
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the array is not writable
            t = torch.from_numpy(a)
        t.sub_(0.5)
        print("wrote", float(t[0, 0, 0]))
    """)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.startswith("wrote"), r.stdout
    # The store file never changes: a fresh process reads the original values.
    got = patchstore.open(frameset.store)[sid]["rgb"]
    np.testing.assert_array_equal(np.asarray(got), want)


# ---- 5. a FIFO is refused at once, never opened ------------------------------------------------------------

@pytest.fixture()
def fifo_store(tmp_path):
    d = tmp_path / "fifo.ps"
    d.mkdir()
    os.mkfifo(d / "data.mdb")
    return d


@pytest.mark.parametrize("command", ["info", "ls", "verify"])
def test_fifo_data_mdb_is_refused(cli, fifo_store, command):
    r = run_cli(cli, command, fifo_store, timeout=20)
    assert r.returncode == 1, r.stderr
    assert "data.mdb is a FIFO, not a regular file" in r.stderr, r.stderr


def test_fifo_data_mdb_python_open_raises(fifo_store):
    with pytest.raises(OSError, match="data.mdb is a FIFO"):
        patchstore.open(str(fifo_store))


def test_fifo_manifest_and_hdf5_are_refused(cli, tmp_path):
    fifo = tmp_path / "m.csv"
    os.mkfifo(fifo)
    r = run_cli(cli, "ingest", "images", tmp_path / "s.ps", "--manifest", fifo, timeout=20)
    assert r.returncode == 1 and "manifest" in r.stderr and "a FIFO, not a regular file" in r.stderr, r.stderr
    h5 = tmp_path / "v.h5"
    os.mkfifo(h5)
    r = run_cli(cli, "ingest", "hdf5", h5, tmp_path / "v.ps", "--group", "MR", timeout=20)
    assert r.returncode == 1 and "a FIFO, not a regular file" in r.stderr, r.stderr
    # An image FIFO decoded in-process (no time limit there) is refused; isolated decoders time out
    # on it instead (tests/ingest/hostile_input_test.cc).
    img = tmp_path / "i.png"
    os.mkfifo(img)
    (tmp_path / "i.csv").write_text(f"id,x\na,{img}\n")
    r = run_cli(cli, "ingest", "images", tmp_path / "i.ps", "--manifest", tmp_path / "i.csv", "--in-process",
                timeout=20)
    assert r.returncode == 1 and "i.png': it is a FIFO, not a regular file" in r.stderr, r.stderr


def test_directory_and_device_inputs_name_what_they_are(cli, tmp_path):
    (tmp_path / "dir.csv").mkdir()
    r = run_cli(cli, "ingest", "images", tmp_path / "s.ps", "--manifest", tmp_path / "dir.csv")
    assert r.returncode == 1 and "it is a directory, not a regular file" in r.stderr, r.stderr
    (tmp_path / "m.csv").write_text("id,rgb\na,/dev/zero\nb,%s\n" % (tmp_path / "dir.csv"))
    r = run_cli(cli, "ingest", "images", tmp_path / "s.ps", "--manifest", tmp_path / "m.csv", "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    assert "'/dev/zero': it is a device, not a regular file" in r.stdout, r.stdout
    assert "dir.csv': it is a directory, not a regular file" in r.stdout, r.stdout


# ---- 6. a resumed ingest cannot change the normalisation -------------------------------------------------

def test_resume_with_other_norm_is_refused(small_frames, tmp_path, cli):
    root, _ = small_frames
    store = str(tmp_path / "n.ps")
    fields = {"rgb": TEMPLATES["rgb"]}
    patchstore.ingest_images(store, root=str(root), fields=fields, norm={"rgb": "unit"}, durable=False)
    with pytest.raises(ValueError, match=r"--norm of field 'rgb' 'unit', this ingest gives 'symmetric'"):
        patchstore.ingest_images(store, root=str(root), fields=fields, norm={"rgb": "symmetric"}, durable=False)
    with pytest.raises(ValueError, match=r"'unit', this ingest gives 'default'"):
        patchstore.ingest_images(store, root=str(root), fields=fields, durable=False)
    # The same spec resumes.
    s = patchstore.ingest_images(store, root=str(root), fields=fields, norm={"rgb": "unit"}, durable=False)
    assert s.samples_present == 2 and s.samples_written == 0
    r = run_cli(cli, "ingest", "images", store, "--root", root, "--field", "rgb=" + TEMPLATES["rgb"],
                "--norm", "rgb=affine:2,0")
    assert r.returncode == 1 and "--norm of field 'rgb'" in r.stderr, r.stderr


# ---- 7. the failure report is checked before the ingest starts -------------------------------------------

def test_unwritable_report_is_refused_before_ingest(cli, small_frames, tmp_path):
    root, _ = small_frames
    store = tmp_path / "r.ps"
    r = run_cli(cli, "ingest", "images", store, "--root", root, "--field", "rgb=" + TEMPLATES["rgb"],
                "--on-error", "skip", "--report", "/nonexistent/x.tsv")
    assert r.returncode == 1, r.stdout
    assert "failure report '/nonexistent/x.tsv': folder '/nonexistent' does not exist" in r.stderr, r.stderr
    assert "failures written" not in r.stdout
    assert not store.exists()  # nothing touched
    with pytest.raises(FileNotFoundError, match="does not exist"):
        patchstore.ingest_images(str(store), root=str(root), fields={"rgb": TEMPLATES["rgb"]}, on_error="skip",
                                 report="/nonexistent/x.tsv")


# ---- 8. JSON output: UTF-8 ids as text, other bytes as surrogate escapes ---------------------------------

def test_json_ids_round_trip_utf8_and_surrogateescape(cli, tmp_path):
    src = tmp_path / "img"
    make_frames(src, ["v"], [1])
    png = src / "v" / "render" / "rgb" / "0001.png"
    ids = ["café/é", "ascii", "tab\there"]
    raw_id = b"bad\xff\xc3(".decode("utf-8", "surrogateescape")  # not valid UTF-8
    manifest = tmp_path / "m.csv"
    with open(manifest, "wb") as f:
        f.write(b"id,rgb\n")
        for i in ids:
            f.write(f'"{i}",{png}\n'.encode())
        f.write(raw_id.encode("utf-8", "surrogateescape") + b"," + str(png).encode() + b"\n")
    store = tmp_path / "u.ps"
    r = run_cli(cli, "ingest", "images", store, "--manifest", manifest, "--no-sync")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([cli, "ls", "--json", str(store)], capture_output=True, timeout=30)
    assert r.returncode == 0
    r.stdout.decode("utf-8")  # the output is valid UTF-8 (lone surrogates stay as \udcXX escapes)
    listed = [entry["id"] for entry in json.loads(r.stdout)]  # ls --json: [{"id": ..., "shapes": ...}]
    assert listed == ids + [raw_id]
    assert b'"caf\xc3\xa9/\xc3\xa9"' in r.stdout  # UTF-8 as is, not \u00c3\u00a9
    assert b'"bad\\udcff\\udcc3("' in r.stdout
    s = patchstore.open(str(store))
    assert list(s.ids) == listed
    for i in listed:
        assert s[i]["rgb"].shape[0] == 3  # each decoded id finds its sample
    info = json.loads(subprocess.run([cli, "info", "--json", str(store)], capture_output=True, timeout=30).stdout)
    assert [f["name"] for f in info["fields"]] == ["rgb"]


# ---- 9. a sealed store changed by another process ---------------------------------------------------------

def test_reader_of_sealed_store_reports_change_not_missing_sample(tmp_path):
    root = tmp_path / "data"
    make_frames(root, ["v1"], range(1, 3))
    store = str(tmp_path / "s.ps")
    fields = {"rgb": TEMPLATES["rgb"]}
    patchstore.ingest_images(store, root=str(root), fields=fields, durable=False)
    old = patchstore.open(store)
    assert len(old) == 2
    with pytest.raises(KeyError):
        old["v1/0009"]  # unchanged store: a plain missing id
    make_frames(root, ["v1"], range(3, 5))
    r = run_python(f"""
        import patchstore
        patchstore.ingest_images({store!r}, root={str(root)!r}, fields={fields!r}, durable=False)
    """)
    assert r.returncode == 0, r.stderr
    with pytest.raises(OSError, match="the store changed since this reader opened it.*reopen the store"):
        old["v1/0003"]
    assert len(patchstore.open(store)) == 4


# ---- 10, 11. numbers: NaN, infinities, zero scale, negative counts ---------------------------------------

@pytest.mark.parametrize("min_valid", [float("inf"), 1e30, 64 * 64 + 1])
def test_min_valid_beyond_window_is_refused(frameset, min_valid):
    with pytest.raises(ValueError, match="asks for more valid pixels than a 64x64 window holds"):
        patchstore.PatchSampler(frameset.store, ["rgb"], patch_size=64, require="mask", min_valid=min_valid)


def test_min_valid_beyond_window_is_refused_in_cpp(frameset):
    from patchstore import _patchstore as _C
    from patchstore._store import reader_of
    store = patchstore.open(frameset.store)
    opts = dict(fields=["rgb"], patch_size=16, patches_per_sample=1, require="mask", min_valid=float("inf"),
                positive_fraction=-1.0, seed=0, rank=0, world_size=1, num_threads=1, flip=False, rot90=False)
    with pytest.raises(ValueError, match=r"min_valid \(--min-valid\) inf asks for more valid pixels than a 16x16 "
                                         r"window holds \(256\)"):
        _C.Sampler(reader_of(store), _C.SamplerOptions(**opts))


@pytest.mark.parametrize("args, message", [
    (["bench", "{store}", "--seconds", "nan"], "--seconds: must be a finite number, got 'nan'"),
    (["bench", "{store}", "--seconds", "inf", "--json"], "--seconds"),
    (["export", "{store}", "{out}", "--window", "-inf,inf"], "--window: must be a finite number"),
    (["montage", "{store}", "{out}/m.png", "--window", "0,nan"], "--window: must be a finite number"),
    (["ingest", "images", "{out}/x.ps", "--manifest", "m.csv", "--decode-timeout", "nan"], "--decode-timeout"),
    (["ingest", "images", "{out}/x.ps", "--manifest", "m.csv", "-j", "-5"], "must be 0 or more, got '-5'"),
])
def test_cli_refuses_non_finite_and_negative_numbers(cli, frameset, tmp_path, args, message):
    args = [a.format(store=frameset.store, out=tmp_path) for a in args]
    r = run_cli(cli, *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr


def test_affine_scale_zero_and_bad_ingest_numbers_are_refused(small_frames, tmp_path):
    root, _ = small_frames
    fields = {"rgb": TEMPLATES["rgb"]}
    store = str(tmp_path / "z.ps")
    with pytest.raises(ValueError, match="SCALE 0 maps every value to OFFSET"):
        patchstore.ingest_images(store, root=str(root), fields=fields, norm={"rgb": "affine:0,0"})
    with pytest.raises(ValueError, match="threads must be 0 \\(all cores\\) or positive, got -5"):
        patchstore.ingest_images(store, root=str(root), fields=fields, threads=-5)
    with pytest.raises(ValueError, match="max_pixels must be positive"):
        patchstore.ingest_images(store, root=str(root), fields=fields, max_pixels=0)
    assert not os.path.exists(store)


def test_export_infinite_window_is_refused(frameset, tmp_path):
    with pytest.raises(ValueError, match="--window needs finite LO < HI"):
        patchstore.export(frameset.store, str(tmp_path / "out"), window=(float("-inf"), float("inf")))


# ---- unclear errors name their cause ---------------------------------------------------------------------

def test_store_open_errors_name_the_cause(tmp_path):
    empty = tmp_path / "empty.ps"
    empty.mkdir()
    (empty / "data.mdb").write_bytes(b"")
    with pytest.raises(patchstore.CorruptRecordError, match=r"data.mdb is empty \(0 bytes\)"):
        patchstore.open(str(empty))
    afile = tmp_path / "file.ps"
    afile.write_bytes(b"x")
    with pytest.raises(ValueError, match="not a directory"):
        patchstore.open(str(afile))
    if os.geteuid() != 0:
        locked = tmp_path / "locked.ps"
        locked.mkdir()
        (locked / "data.mdb").write_bytes(b"x" * 8192)
        locked.chmod(0)
        try:
            with pytest.raises(OSError, match="permission denied reading the directory"):
                patchstore.open(str(locked))
        finally:
            locked.chmod(0o755)


def test_python_arguments_are_checked_before_the_binding(frameset):
    store = patchstore.open(frameset.store)
    sid = next(iter(frameset.frames))
    with pytest.raises(KeyError) as e:
        store["x\udcff"]  # a non-UTF-8 id: KeyError naming it (bytes escaped), not UnicodeDecodeError
    assert e.value.args[0].startswith("no sample 'x\\xff' in "), e.value.args
    with pytest.raises(TypeError):
        store.patch(sid, "rgb", 0.5, 0, 8, 8)  # was truncated to 0
    with pytest.raises(TypeError):
        store.patch(sid, "rgb", "0", 0, 8, 8)  # was parsed
    with pytest.raises(IndexError, match="outside every record"):
        store.patch(sid, "rgb", 2 ** 63, 0, 8, 8)
    with pytest.raises(ValueError, match="the path contains a NUL byte"):
        patchstore.open(frameset.store + "\0x")
    for kw in ({"num_threads": 2 ** 63}, {"patches_per_sample": 2 ** 63}, {"world_size": 2 ** 63},
               {"patch_size": 2 ** 63}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            patchstore.PatchSampler(frameset.store, ["rgb"], **{"patch_size": 8, **kw})


def test_no_admissible_window_says_how_many_pixels_min_valid_asked_for(frameset):
    # The best 40x40 window of any frame, by brute force over every position.
    from numpy.lib.stride_tricks import sliding_window_view
    best = max(int(sliding_window_view(f.mask != 0, (40, 40)).sum(axis=(2, 3)).max())
               for f in frameset.frames.values())
    assert 0 < best < 80
    share = f"{best / 1600:.1%}"
    s = patchstore.PatchSampler(frameset.store, ["rgb"], patch_size=40, require="mask", min_valid=0.05)
    with pytest.raises(ValueError) as e:
        s.batch(1)
    assert (f"min_valid=0.05: at least 80 valid pixels of the 1600 in a window; the best 40x40 window holds "
            f"{best} ({share})") in str(e.value), str(e.value)
    torch = pytest.importorskip("patchstore.torch")
    with pytest.raises(ValueError) as e:
        torch.PatchDataset(frameset.store, ["rgb"], patch_size=40, require="mask", min_valid=0.05)[0]
    assert f"at least 80 valid pixels of the 1600 in a window; the best 40x40 window holds {best}" in str(e.value), \
        str(e.value)


def test_root_group_without_field_name_says_so(cli, tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f["p1"] = np.zeros((2, 3, 4), np.int16)
    r = run_cli(cli, "ingest", "hdf5", tmp_path / "v.h5", tmp_path / "v.ps", "--group", "/")
    assert r.returncode == 2 and "is the root group, which gives no field name; name the field: --group /=FIELD" \
        in r.stderr, r.stderr
    r = run_cli(cli, "ingest", "hdf5", tmp_path / "v.h5", tmp_path / "v.ps", "--group", "/=vol", "--no-sync")
    assert r.returncode == 0, r.stderr
    store = patchstore.open(str(tmp_path / "v.ps"))
    with pytest.raises(ValueError, match=r"context 4611686018427387904 is not in \[0, 2\*\*20\]"):
        store.slice("p1", "vol", 0, context=2 ** 62)
    with pytest.raises(IndexError):
        store.slice("p1", "vol", 2 ** 63)


def test_cmyk_jpeg_is_refused_and_rgb_jpegs_are_read(cli, tmp_path):
    # OpenCV turns a CMYK JPEG's inks into RGB by a rule of its own (not exact): refused, as CMYK TIFFs are.
    image = pytest.importorskip("PIL.Image")
    (tmp_path / "i").mkdir()
    x = (np.arange(20 * 12 * 4) * 7 % 253).astype(np.uint8).reshape(20, 12, 4)
    image.fromarray(x, "CMYK").save(tmp_path / "i" / "inks.jpg")
    image.fromarray(x[..., :3], "RGB").save(tmp_path / "i" / "rgb.jpg")
    image.fromarray(x[..., 1:], "RGB").save(tmp_path / "i" / "rgb2.jpg")
    r = run_cli(cli, "ingest", "images", tmp_path / "s.ps", "--root", tmp_path / "i", "--field", "x={id}.jpg",
                "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    assert "ingested 2 new samples (0 already present, 1 failed) of 3" in r.stdout, r.stdout
    report = (tmp_path / "s.ps" / "ingest-errors.tsv").read_text()
    assert "inks.jpg" in report and "a CMYK JPEG holds ink separations" in report, report
    s = patchstore.open(tmp_path / "s.ps")
    assert sorted(s.ids) == ["rgb", "rgb2"]
    assert s.get("rgb", "x").shape == (3, 20, 12)


def test_failure_report_lists_the_last_runs_failures_only(tmp_path):
    image = pytest.importorskip("PIL.Image")
    d = tmp_path / "i"
    d.mkdir()
    good = (np.arange(6 * 5 * 3) % 251).astype(np.uint8).reshape(6, 5, 3)
    for name in ("a", "b", "c"):
        (d / f"{name}.png").write_bytes(b"not a png, " + name.encode())
    image.fromarray(good).save(d / "ok.png")
    store, report = tmp_path / "s.ps", tmp_path / "s.ps" / "ingest-errors.tsv"

    def run():
        return patchstore.ingest_images(store, root=d, fields={"rgb": "{id}.png"}, on_error="skip", progress=False,
                                        durable=False)

    assert run().samples_failed == 3
    assert sorted(line.split("\t")[0] for line in report.read_text().splitlines()) == ["a", "b", "c"]
    image.fromarray(good[::-1]).save(d / "b.png")  # b fixed: the next run's report lists a and c only
    s = run()
    assert (s.samples_written, s.samples_failed) == (1, 2)
    assert sorted(line.split("\t")[0] for line in report.read_text().splitlines()) == ["a", "c"]
    for name in ("a", "c"):
        image.fromarray(good).save(d / f"{name}.png")
    assert run().samples_failed == 0 and not report.exists()  # nothing failed: no stale report
