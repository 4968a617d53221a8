"""Shard sets (issue 16): `ingest --shard I/N` in parallel processes, read back as one store."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import patchstore

from conftest import TEMPLATES, make_frames

FIELDS = ["rgb", "mask", "depth"]
N = 3


def _run(cli: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([cli, *args], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def _field_args(root: Path) -> List[str]:
    out = ["--root", str(root)]
    for name, tpl in TEMPLATES.items():
        out += ["--field", f"{name}={tpl}"]
    return out


def _content(store: patchstore.Store) -> Dict[str, Dict[str, bytes]]:
    """{id: {field: exact record bytes}} of every sample."""
    return {sid: {f: np.ascontiguousarray(store[sid][f]).tobytes() for f in FIELDS} for sid in store.ids}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, cli):
    """24 frames ingested once into one store and, by 3 processes at once, into 3 shards."""
    if not cli:
        pytest.skip("the patchstore program is not built")
    base = tmp_path_factory.mktemp("shards")
    root = base / "data"
    make_frames(root, ["v1", "v2", "v3"], range(1, 9), seed=3)
    single = base / "single.ps"
    _run(cli, "ingest", "images", str(single), *_field_args(root), "--no-sync", "-j", "1", "--in-process")
    shard_dir = base / "set"
    shard_dir.mkdir()
    procs = [subprocess.Popen([cli, "ingest", "images", str(shard_dir / f"frames-{i}.ps"), *_field_args(root),
                               "--shard", f"{i}/{N}", "--no-sync", "-j", "1", "--in-process"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(N)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "store sealed" in out
    return base, root, single, shard_dir


def test_parallel_shards_equal_a_single_ingest(sharded):
    base, root, single, shard_dir = sharded
    one = patchstore.open(single)
    whole = _content(one)
    assert len(whole) == 24
    seen: Dict[str, Dict[str, bytes]] = {}
    for i in range(N):
        shard = patchstore.open(shard_dir / f"frames-{i}.ps")
        assert shard.sealed
        assert shard.attributes["shard"] == f"{i}/{N}"
        part = _content(shard)
        assert part, "24 ids over 3 shards: every shard holds some (checked for this input)"
        assert not (set(part) & set(seen))
        seen.update(part)
        # Each shard keeps the single store's order of its samples.
        order = [sid for sid in one.ids if sid in part]
        assert list(shard.ids) == order
    assert seen == whole  # same ids, same record bytes
    # The record headers (with their body checksums) agree too, read from each shard store.
    whole_set = patchstore.open(shard_dir)
    for sid in whole:
        path, local = whole_set.store_of(sid)
        shard = patchstore.open(path)
        assert shard.ids[local] == sid
        for f in FIELDS:
            h = shard.header(local, f)
            assert h == one.header(sid, f) and h["checksum"]


def test_shard_set_reads_as_one_store(sharded):
    base, root, single, shard_dir = sharded
    one = patchstore.open(single)
    paths = [str(shard_dir / f"frames-{i}.ps") for i in (2, 0, 1)]  # any order given: shard order read
    for spec in (paths, str(shard_dir), str(shard_dir / "frames-*.ps")):
        s = patchstore.open(spec)
        assert len(s) == len(one)
        assert s.store_paths == tuple(str(shard_dir / f"frames-{i}.ps") for i in range(N))
        assert sorted(s.ids) == sorted(one.ids)
        assert s.sealed and s.kind == "frames"
        assert list(s.fields) == list(one.fields)
        for sid in one.ids:
            assert s.index(sid) == list(s.ids).index(sid)
            for f in FIELDS:
                np.testing.assert_array_equal(s[sid][f], one[sid][f])
        assert s.verify() == 3 * len(one)
        # Global order: the single ingest's (each shard records its samples' places in the whole input).
        assert list(s.ids) == list(one.ids)
        assert patchstore.open(shard_dir).store_of(one.ids[0])[1] == 0
        assert patchstore.open(s.path).store_paths == s.store_paths  # what pickling reopens


def test_sampler_on_a_set_equals_the_single_store(sharded):
    """Global mode: the same seed gives the same windows from the shard set as from one ingest of the input."""
    base, root, single, shard_dir = sharded
    s = patchstore.open(shard_dir)
    assert list(s.ids) == list(patchstore.open(single).ids)
    for kwargs in ({}, {"require": "mask"}):
        a = patchstore.PatchSampler(s, FIELDS, 16, patches_per_sample=3, seed=5, **kwargs)
        b = patchstore.PatchSampler(single, FIELDS, 16, patches_per_sample=3, seed=5, **kwargs)
        wa, wb = a.windows(0), b.windows(0)
        np.testing.assert_array_equal(wa.array, wb.array)
        ba, bb = a.batch(20), b.batch(20)
        for f in FIELDS:
            np.testing.assert_array_equal(ba[f], bb[f])


def test_set_errors_name_the_stores(sharded, tmp_path):
    base, root, single, shard_dir = sharded
    s0, s1, s2 = (str(shard_dir / f"frames-{i}.ps") for i in range(N))
    with pytest.raises(ValueError, match=r"3 shards: 2 found .*shard 1 missing"):
        patchstore.open([s0, s2])
    with pytest.raises(ValueError, match=r"frames-1.ps' and '.*frames-1.ps' are both shard 1/3"):
        patchstore.open([s0, s1, s1, s2])
    with pytest.raises(ValueError, match=r"is a shard \(0/3\) but '.*single.ps' is not"):
        patchstore.open([s0, str(single)])
    # Two plain stores holding one id: both named.
    with pytest.raises(ValueError, match=r"sample id 'v1/0001' is in '.*single.ps' \(sample #0\) and in "
                                         r"'.*copy.ps' \(sample #0\)"):
        shutil.copytree(single, tmp_path / "copy.ps")
        patchstore.open([str(single), str(tmp_path / "copy.ps")])
    with pytest.raises(FileNotFoundError):
        patchstore.open(str(tmp_path / "nothing-*.ps"))


def test_verify_on_a_set_names_the_shard_and_sample(sharded, tmp_path):
    base, root, single, shard_dir = sharded
    dam = tmp_path / "set"
    shutil.copytree(shard_dir, dam)
    victim = patchstore.open(dam / "frames-1.ps")
    sid = victim.ids[0]
    depth = victim[sid]["depth"]
    needle = np.ascontiguousarray(depth).tobytes()[:64]
    data = bytearray((dam / "frames-1.ps" / "data.mdb").read_bytes())
    at = data.find(needle)
    assert at > 0
    data[at + 8] ^= 0xFF
    (dam / "frames-1.ps" / "data.mdb").write_bytes(bytes(data))
    s = patchstore.open(dam)
    with pytest.raises(patchstore.CorruptRecordError, match=rf"'{sid}' field 'depth' in '.*frames-1.ps'"):
        s.verify()


def test_shard_cli_errors(sharded, cli, tmp_path):
    base, root, single, shard_dir = sharded
    for bad, why in (("3/3", "index I must be 0..2"), ("1/0", "count N must be"), ("x", "expected I/N"),
                     ("-1/3", "expected I/N")):
        r = _run(cli, "ingest", "images", str(tmp_path / "s.ps"), *_field_args(root), "--shard", bad, check=False)
        assert r.returncode == 2, r.stderr
        assert why in r.stderr and f"'{bad}'" in r.stderr
        assert not (tmp_path / "s.ps").exists()
    # A shard resumes only as the same shard; a whole store takes no --shard.
    r = _run(cli, "ingest", "images", str(shard_dir / "frames-0.ps"), *_field_args(root), "--shard", "1/3",
             check=False)
    assert r.returncode != 0 and "the store is shard 0/3" in r.stderr
    r = _run(cli, "ingest", "images", str(shard_dir / "frames-0.ps"), *_field_args(root), check=False)
    assert r.returncode != 0 and "the store is shard 0/3" in r.stderr and "no --shard" in r.stderr
    r = _run(cli, "ingest", "images", str(single), *_field_args(root), "--shard", "0/3", check=False)
    assert r.returncode != 0 and "ingested without --shard" in r.stderr
    # Resuming the same shard is a no-op.
    r = _run(cli, "ingest", "images", str(shard_dir / "frames-2.ps"), *_field_args(root), "--shard", "2/3")
    store = shard_dir / "frames-2.ps"
    assert r.stdout.startswith(f"all {r.stdout.split()[1]} samples already in '{store}': nothing to do"), r.stdout
    assert "projected" not in r.stderr and "0/0" not in r.stderr, r.stderr


def test_python_shard_argument(sharded, tmp_path):
    base, root, single, shard_dir = sharded
    with pytest.raises(ValueError, match="index i must be 0..1"):
        patchstore.ingest_images(str(tmp_path / "x.ps"), root=root, fields=TEMPLATES, shard=(2, 2))
    with pytest.raises(TypeError):
        patchstore.ingest_images(str(tmp_path / "x.ps"), root=root, fields=TEMPLATES, shard=3)
    for bad in ((True, 2), (0, True), (False, 1)):  # bools were taken as ints (shard 1 of 2)
        with pytest.raises(TypeError, match=r"shard must be a pair of ints \(i, n\)"):
            patchstore.ingest_images(str(tmp_path / "x.ps"), root=root, fields=TEMPLATES, shard=bad)
    assert not (tmp_path / "x.ps").exists()
    parts = []
    for i in range(2):
        out = str(tmp_path / f"p{i}.ps")
        summary = patchstore.ingest_images(out, root=root, fields=TEMPLATES, shard=(i, 2), durable=False,
                                           progress=False)
        parts.append(summary.samples_written)
        assert summary.samples_total == summary.samples_written
    assert sum(parts) == 24
    s = patchstore.open([str(tmp_path / "p0.ps"), str(tmp_path / "p1.ps")])
    assert sorted(s.ids) == sorted(patchstore.open(single).ids)


def test_hdf5_shards_from_two_files_equal_a_single_ingest(tmp_path, cli):
    """ingest_hdf5(shard=...) and `ingest hdf5 --shard`: ids assigned over all files ("a/p1"), then split."""
    pytest.importorskip("h5py")
    from test_volumes import make_volumes, write_h5

    rng = np.random.default_rng(4)
    files = []
    for k, stem in enumerate(("a", "b")):
        vols = make_volumes(rng, {f"patient{i:03}": (3 + i % 3, 8, 8) for i in range(6 * k, 6 * k + 6)})
        write_h5(tmp_path / f"{stem}.h5", vols, "shw")
        files.append(str(tmp_path / f"{stem}.h5"))
    single = str(tmp_path / "single.ps")
    patchstore.ingest_hdf5(files, single, slice_axis=0, durable=False, progress=False)
    one = patchstore.open(single)
    assert len(one) == 12 and one.ids[0] == "a/patient000"
    paths = []
    for i in range(3):
        out = str(tmp_path / f"v-{i}.ps")
        if i == 2 and cli:
            _run(cli, "ingest", "hdf5", *files, out, "--group", "MR", "--group", "CT", "--group", "MASK",
                 "--slice-axis", "0", "--shard", "2/3", "--no-sync")
        else:
            patchstore.ingest_hdf5(files, out, slice_axis=0, durable=False, progress=False, shard=(i, 3))
        paths.append(out)
        assert patchstore.open(out).attributes["shard"] == f"{i}/3"
    s = patchstore.open(paths)
    assert s.kind == "volumes" and sorted(s.ids) == sorted(one.ids)
    for sid in one.ids:
        for f in one.fields:
            np.testing.assert_array_equal(s[sid][f], one[sid][f])
    with pytest.raises(ValueError, match="the store is shard 0/3"):
        patchstore.ingest_hdf5(files, paths[0], slice_axis=0, durable=False, progress=False, shard=(1, 3))


def test_set_pickles_and_reopens_in_dataloader_workers(sharded):
    """Workers reopen a set from Store.path (a tuple for a list, the folder for a folder): same data."""
    import pickle

    base, root, single, shard_dir = sharded
    for spec in ([str(shard_dir / f"frames-{i}.ps") for i in range(N)], str(shard_dir)):
        s = patchstore.open(spec)
        back = pickle.loads(pickle.dumps(s))
        assert back.store_paths == s.store_paths and list(back.ids) == list(s.ids)
        sampler = patchstore.PatchSampler(s, FIELDS, 16, patches_per_sample=2, seed=9)
        again = pickle.loads(pickle.dumps(sampler))
        np.testing.assert_array_equal(again.windows(1).array, sampler.windows(1).array)
    torch = pytest.importorskip("torch")
    from patchstore.torch import PatchDataset

    ds = PatchDataset(str(shard_dir), FIELDS, 16, patches_per_sample=2, seed=4)
    ref = PatchDataset(str(shard_dir), FIELDS, 16, patches_per_sample=2, seed=4)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    got = [b["rgb"] for b in loader]
    want = [torch.stack([torch.as_tensor(ref[i]["rgb"]) for i in range(j, min(j + 4, len(ref)))])
            for j in range(0, len(ref), 4)]
    assert len(got) == len(want) and len(ds) == 24
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_rank_local_reading_covers_every_sample_once_per_epoch(sharded):
    base, root, single, shard_dir = sharded
    everything = sorted(patchstore.open(shard_dir).ids)
    world = 2
    ranks = [patchstore.RankLocalShards(str(shard_dir), r, world, seed=1, assign="per_epoch") for r in range(world)]
    assignments = set()
    for epoch in range(4):
        seen: List[str] = []
        for rl in ranks:
            assert rl.assignment(epoch) == patchstore.RankLocalShards(
                str(shard_dir), rl.rank, world, seed=1, assign="per_epoch").assignment(epoch)  # deterministic
            store = rl.open(epoch)
            assert set(store.store_paths) == set(rl.paths(epoch))
            sampler = patchstore.PatchSampler(store, FIELDS, 16, patches_per_sample=1, seed=epoch)
            seen += sampler.windows(epoch).ids
        assert sorted(seen) == everything  # every sample exactly once across the ranks
        assignments.add(tuple(tuple(rl.assignment(epoch)) for rl in ranks))
    assert len(assignments) > 1  # shards move between ranks across epochs
    state = ranks[0].state_dict()
    assert state == {"shard_count": 3, "world_size": 2, "rank": 0, "seed": 1, "assign": "per_epoch"}
    other = patchstore.RankLocalShards(str(shard_dir), 0, 3, seed=1, assign="per_epoch")
    with pytest.raises(ValueError, match="world_size=2, this run has world_size=3"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="3 shards cannot be spread over 4 ranks"):
        patchstore.RankLocalShards(str(shard_dir), 0, 4)


def test_torchrun_reads_every_sample_once_per_epoch(sharded, tmp_path):
    """The README recipe: torchrun --nproc-per-node=2 (gloo) over the shard set, global and rank-local; rank-local
    on nodes holding only their own shards (of unequal sizes) runs the same steps on both ranks (even=)."""
    pytest.importorskip("torch")
    import sys
    from collections import Counter

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    base, root, single, shard_dir = sharded
    own = []
    for rank in range(2):  # each node's local disk: copies of its own shards (assign="fixed")
        mine = patchstore.RankLocalShards(shard_dir, rank, 2, seed=3).assignment()
        (tmp_path / f"node-{rank}").mkdir()
        for i in mine:
            shutil.copytree(shard_dir / f"frames-{i}.ps", tmp_path / f"node-{rank}" / f"frames-{i}.ps")
        own.append(sum(len(patchstore.open(shard_dir / f"frames-{i}.ps")) for i in mine))
    assert own[0] != own[1]  # 3 shards over 2 ranks: unequal shares
    env = dict(os.environ, OMP_NUM_THREADS="1")
    script = Path(__file__).with_name("torchrun_shards.py")
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=2", str(script), str(shard_dir),
                        str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    everything = sorted(patchstore.open(shard_dir).ids)

    def read(mode, epoch):
        return [(tmp_path / f"{mode}-{epoch}-{rank}.txt").read_text().split() for rank in range(2)]

    for epoch in range(2):
        for mode in ("global", "local"):
            per_rank = read(mode, epoch)
            assert all(per_rank)
            assert sorted(per_rank[0] + per_rank[1]) == everything, (mode, epoch)  # exactly once
        for mode, length in (("pad", max(own)), ("truncate", min(own))):
            per_rank = read(mode, epoch)
            steps = [(tmp_path / f"{mode}-{epoch}-{rank}.steps").read_text().split() for rank in range(2)]
            assert steps == [[str(-(-length // 4)), str(length), str(own[rank])] for rank in range(2)], mode
            assert [len(ids) for ids in per_rank] == [length, length]
            counts = Counter(per_rank[0] + per_rank[1])
            if mode == "pad":
                assert sorted(counts) == everything  # every sample at least once
            else:
                assert max(counts.values()) == 1  # at most once


def _staging_of(folder: Path, name: str) -> List[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(name + ".copy-"))


def _start_paused_copy(cli: str, src: Path, dst: Path, *args: str) -> "tuple[subprocess.Popen, Path]":
    """A `patchstore copy` (with `args`) held (test hook) right after it made its staging folder;
    (process, folder)."""
    env = dict(os.environ, PATCHSTORE_TEST_STAGING_PAUSE_S="60")
    before = set(_staging_of(dst.parent, dst.name))
    proc = subprocess.Popen([cli, "-q", "copy", str(src), str(dst), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for _ in range(3000):
        new = [p for p in _staging_of(dst.parent, dst.name) if p not in before]
        marker = new[0] / ".patchstore-staging" if new else None
        if marker is not None and marker.exists() and marker.read_text().startswith("pid="):
            return proc, new[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the paused copy made no staging folder")


def test_killed_copies_are_removed_by_the_next_copy_and_skipped_by_shard_folders(sharded, cli, tmp_path):
    """Issue 31 item 7: a SIGKILLed copy's DST.copy-XXXXXX folder is removed (and named) by the next copy to
    DST, never while its copy runs, and a folder of shards holding one still opens, naming it."""
    base, root, single, shard_dir = sharded
    local = tmp_path / "local"
    local.mkdir()
    for i in (0, 1):
        _run(cli, "-q", "copy", str(shard_dir / f"frames-{i}.ps"), str(local / f"frames-{i}.ps"))
    dst = local / "frames-2.ps"
    proc, left = _start_paused_copy(cli, shard_dir / "frames-2.ps", dst)
    proc.kill()  # SIGKILL
    proc.communicate(timeout=30)
    assert left.is_dir() and not dst.exists()
    # What a kill in the middle of LMDB's copy leaves: the first part of a data.mdb.
    whole = (shard_dir / "frames-2.ps" / "data.mdb").read_bytes()
    (left / "data.mdb").write_bytes(whole[: len(whole) // 3])
    # The folder of shards: the leftover is no store of the set; the error is the missing shard.
    with pytest.warns(UserWarning, match=r"skipped 1 staging folder '" + left.name + "'"):
        with pytest.raises(ValueError, match=r"shard 2 missing"):
            patchstore.open(local)
    r = _run(cli, "info", str(local), check=False)
    assert r.returncode == 1 and "truncated" not in r.stderr
    assert f"warning: '{local}': skipped 1 staging folder '{left.name}'" in r.stderr
    assert "shard 2 missing" in r.stderr
    # A copy to another destination leaves it alone; the next copy to the same one removes it and says so.
    _run(cli, "-q", "copy", str(shard_dir / "frames-2.ps"), str(tmp_path / "elsewhere.ps"))
    assert left.is_dir()
    r = _run(cli, "-q", "copy", str(shard_dir / "frames-2.ps"), str(dst))
    assert f"copy: removed '{left}': left by an interrupted copy (pid {proc.pid}" in r.stderr
    assert not left.exists() and _staging_of(local, "frames-2.ps") == []
    whole_set = patchstore.open(local)
    assert _content(whole_set) == _content(patchstore.open(single))


def test_a_killed_conversion_leaves_no_store_and_the_next_one_cleans_up(sharded, cli, tmp_path):
    """copy --layout/--encoding stages through the same engine: killed, it leaves no DST, and the next
    conversion to DST removes its folder (with a half-written LMDB in it) and writes the whole store."""
    base, root, single, shard_dir = sharded
    src, dst = shard_dir / "frames-1.ps", tmp_path / "t.ps"
    proc, left = _start_paused_copy(cli, src, dst, "--layout", "tiles", "--tile-size", "24", "--encoding", "compact")
    proc.kill()
    proc.communicate(timeout=30)
    assert left.is_dir() and not dst.exists()
    (left / "data.mdb").write_bytes((src / "data.mdb").read_bytes()[:20000])  # what a kill mid-write leaves
    r = _run(cli, "-q", "copy", str(src), str(dst), "--layout", "tiles", "--tile-size", "24", "--encoding", "compact")
    assert f"copy: removed '{left}': left by an interrupted copy (pid {proc.pid}" in r.stderr, r.stderr
    assert not left.exists() and _staging_of(tmp_path, "t.ps") == []
    t = patchstore.open(dst)
    assert {(i.dtype, i.tile) for f, i in t.fields.items() if f != "depth"} == {("uint8", 24)}
    assert _content(t) == _content(patchstore.open(src))


def test_a_running_copy_keeps_its_staging_folder(sharded, cli, tmp_path):
    base, root, single, shard_dir = sharded
    dst = tmp_path / "one.ps"
    proc, live = _start_paused_copy(cli, shard_dir / "frames-1.ps", dst)
    try:
        r = _run(cli, "-q", "copy", str(shard_dir / "frames-1.ps"), str(dst))
        assert f"copy: kept '{live}': being written by a running copy (pid {proc.pid}" in r.stderr
        assert live.is_dir() and (live / ".patchstore-staging").exists()
        assert len(patchstore.open(dst)) == len(patchstore.open(shard_dir / "frames-1.ps"))
        assert not (dst / ".patchstore-staging").exists()
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_copy_to_an_empty_or_nested_destination_is_a_usage_error(sharded, cli, tmp_path):
    base, root, single, shard_dir = sharded
    src = tmp_path / "a.ps"
    _run(cli, "-q", "copy", str(shard_dir / "frames-0.ps"), str(src))
    before = sorted(p.name for p in src.iterdir())
    r = _run(cli, "copy", str(src), "", check=False)
    assert r.returncode == 2 and "the destination path is empty" in r.stderr, r.stderr
    r = _run(cli, "copy", str(src), str(src / "sub.ps"), check=False)
    assert r.returncode == 2 and "the destination lies inside the source store" in r.stderr, r.stderr
    r = _run(cli, "copy", str(src / "x.ps"), str(src), check=False)
    assert r.returncode == 1 and "exists" in r.stderr, r.stderr
    r = _run(cli, "copy", str(tmp_path / "b.ps" / "inner.ps"), str(tmp_path / "b.ps"), check=False)
    assert r.returncode == 2 and "the source lies inside the destination" in r.stderr, r.stderr
    assert sorted(p.name for p in src.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ps"]
