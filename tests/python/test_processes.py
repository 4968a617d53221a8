"""Many reader processes at once, and readers killed with SIGKILL."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import patchstore

FIELDS = ("rgb", "mask", "depth")


def digest_of(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float32).tobytes())
    return h.hexdigest()


def expected_digest(frameset) -> str:
    arrays = []
    for sid in sorted(frameset.frames):
        exp = frameset.frames[sid].expected()
        arrays += [exp[f] for f in FIELDS]
        arrays.append(exp["rgb"][:, 7:23, 11:27])
    return digest_of(arrays)


def _reader(store_or_path, barrier, queue, k):
    try:
        store = store_or_path if isinstance(store_or_path, patchstore.Store) else patchstore.open(store_or_path)
        barrier.wait(timeout=120)
        arrays = []
        for i in range(len(store)):
            sample = store[i]
            arrays += [sample[f] for f in FIELDS]
            arrays.append(store.read_patches([i], "rgb", [7], [11], 16, 16)[0])
        queue.put((k, os.getpid(), digest_of(arrays), store.no_lock))
    except BaseException as e:  # report, never hang the parent
        queue.put((k, os.getpid(), f"error: {type(e).__name__}: {e}", None))


@pytest.mark.parametrize("which", ["sealed", "live"])
def test_64_concurrent_readers_bit_exact(frameset, live_store, which):
    path = frameset.store if which == "sealed" else live_store
    want = expected_digest(frameset)
    ctx = mp.get_context("fork")
    inherited = patchstore.open(path)  # half the children use the parent's Store object after fork
    assert inherited.no_lock == (which == "sealed")
    n = 64
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(inherited if k % 2 else path, barrier, queue, k)) for k in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=180) for _ in range(n)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(r[0] for r in results) == list(range(n))
    assert len({r[1] for r in results}) == n  # 64 distinct processes
    for k, _, digest, no_lock in results:
        assert digest == want, f"reader {k}: {digest}"
        assert no_lock == (which == "sealed")
    # The parent's object was never touched by the children.
    assert digest_of([a for i in range(len(inherited)) for a in
                      [inherited[i][f] for f in FIELDS] + [inherited.read_patches([i], "rgb", [7], [11], 16, 16)[0]]]
                     ) == want


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import patchstore
    path, rounds, per_round = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    # Held open throughout: while any process has the environment open, LMDB
    # keeps the reader table (the last one out does not get to reset it).
    keeper = patchstore.open(path)
    assert keeper[0]["rgb"].shape[0] == 3 and not keeper.no_lock
    for _ in range(rounds):
        r, w = os.pipe()
        pids = []
        for _ in range(per_round):
            pid = os.fork()
            if pid == 0:
                os.close(r)
                ok = b"0"
                try:
                    s = patchstore.open(path)   # takes a reader slot in lock.mdb (live store)
                    ok = b"1" if (s[0]["rgb"].shape[0] == 3 and not s.no_lock) else b"2"
                finally:
                    os.write(w, ok)
                signal.pause()
                os._exit(0)
            pids.append(pid)
        os.close(w)
        got = b""
        while len(got) < per_round:
            chunk = os.read(r, per_round)
            if not chunk:
                break
            got += chunk
        os.close(r)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)     # dies holding its read transaction
        for pid in pids:
            os.waitpid(pid, 0)
        assert got == b"1" * per_round, got
    s = patchstore.open(path)
    print(len(s), s.no_lock, float(s.read_patches([0], "depth", [0], [0], 2, 2).sum()))
""")


def test_killed_readers_do_not_exhaust_the_reader_table(frameset, live_store):
    # LMDB's reader table has 1024 slots. 9 rounds of 128 readers killed while
    # holding a transaction leave 1152 stale slots unless opening clears them
    # (mdb_reader_check). A process keeps the store open meanwhile, as a
    # training job's main process does.
    out = subprocess.run([sys.executable, "-c", KILL_SCRIPT, live_store, "9", "128"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    n, no_lock, total = out.stdout.split()
    exp = frameset.frames["video01/0001"].expected()["depth"][:, :2, :2].sum(dtype=np.float32)
    assert (int(n), no_lock, float(total)) == (20, "False", float(exp))
