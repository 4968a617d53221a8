#!/usr/bin/env python3
"""Where a conversion's time goes: `patchstore copy --layout tiles --encoding compact` against re-ingesting the
sources, durable and with --no-sync, from evicted files and (copy only) from a source in the page cache.

    .venv/bin/python bench/convert_floor.py WORK RUNS [--cli build/patchstore]

WORK holds frames/ (tools/make_frames.py WORK/frames ...); WORK/rows.ps (rows/float32) is ingested from them
on the first call. RUNS: comma-separated, each one of copy, copyns (--no-sync), copywarm (--no-sync, source
read into the page cache first), ingest, ingestns (--no-sync). Prints wall and CPU seconds (user, sys) of
each run; `perf record` the same commands for the profile (bench/results/convert.md).
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import time

FIELDS = ["--field=rgb={video}/render/rgb/{frame}.png", "--field=mask={video}/render/masks/{frame}.png",
          "--field=depth={video}/render/depth/{frame}.exr"]
TILES = ["--layout", "tiles", "--encoding", "compact"]


def evict(paths):
    """Syncs every file under `paths` and drops its pages from the page cache."""
    for top in paths:
        for d, _, files in os.walk(top):
            for n in files:
                fd = os.open(os.path.join(d, n), os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def run(cmd):
    """(wall, user, sys) seconds of `cmd` and its children."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return dt, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work")
    ap.add_argument("runs")
    ap.add_argument("--cli", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                  "build", "patchstore"))
    a = ap.parse_args()
    frames, rows = os.path.join(a.work, "frames"), os.path.join(a.work, "rows.ps")
    if not os.path.exists(rows):
        evict([frames])
        print("ingest rows/float32: wall %.2f s, user %.2f, sys %.2f" % run(
            [a.cli, "-q", "ingest", "images", rows, "--root", frames] + FIELDS))
    for what in a.runs.split(","):
        out = os.path.join(a.work, "out.ps")
        shutil.rmtree(out, ignore_errors=True)
        sync = ["--no-sync"] if what.endswith(("ns", "warm")) else []
        if what == "copywarm":
            subprocess.run(["cat", os.path.join(rows, "data.mdb")], stdout=subprocess.DEVNULL, check=True)
        else:
            evict([rows, frames])
        if what.startswith("copy"):
            cmd = [a.cli, "-q", "copy", rows, out] + TILES + sync
        elif what.startswith("ingest"):
            cmd = [a.cli, "-q", "ingest", "images", out, "--root", frames] + TILES + sync + FIELDS
        else:
            sys.exit(f"unknown run {what!r}")
        wall, user, sys_ = run(cmd)
        size = os.path.getsize(os.path.join(out, "data.mdb")) / 1e6
        print(f"{what:10s} wall {wall:6.2f} s  user {user:5.2f}  sys {sys_:5.2f}  out {size:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
