#!/usr/bin/env python3
"""Converting a store with `patchstore copy --layout tiles --encoding compact` vs ingesting its sources again.

    .venv/bin/python bench/convert_bench.py [--frames 60] [--rounds 1] [--work DIR] [--cli build/patchstore]

Generates N full-HD frames (rgb PNG, mask PNG, depth EXR; tools/make_frames.py), ingests them into a
rows/float32 store (the default), then times, from an uncached start each time:

  copy      patchstore copy ROWS.ps OUT.ps --layout tiles --encoding compact
            (reads the float32 records, re-encodes, writes, verifies every checksum)
  re-ingest patchstore ingest images OUT.ps ... --layout tiles --encoding compact
            (decodes every PNG and EXR again, writes)

"Uncached": every file either command reads (the source frames, the rows store) is synced and dropped
from the page cache with posix_fadvise(POSIX_FADV_DONTNEED) before each run, as bench/scale does.
Rounds alternate copy and re-ingest. Both outputs are checked to read the same values. Prints a markdown
table (with date, machine and command) for bench/results/convert.md, and removes the generated data
unless --keep.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = {
    "rgb": "{video}/render/rgb/{frame}.png",
    "mask": "{video}/render/masks/{frame}.png",
    "depth": "{video}/render/depth/{frame}.exr",
}


def evict(paths):
    """Syncs every file under `paths` and drops its pages from the page cache."""
    for top in paths:
        for dirpath, _, files in os.walk(top):
            for name in files:
                p = os.path.join(dirpath, name)
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def run(cmd):
    """Runs `cmd`; returns (wall seconds, CPU seconds of it and its children: user + system)."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return dt, (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)


def store_bytes(store):
    return os.path.getsize(os.path.join(store, "data.mdb"))


def same_reads(a, b):
    import numpy as np

    import patchstore

    sa, sb = patchstore.open(a), patchstore.open(b)
    assert list(sa.ids) == list(sb.ids), "ids differ"
    for i in range(len(sb)):
        for f in sb.fields:
            x, y = np.asarray(sa[i][f], dtype=np.float32), np.asarray(sb[i][f], dtype=np.float32)
            assert x.tobytes() == y.tobytes(), f"sample {i} field {f} differs"


def ram_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=1, help="copy / re-ingest pairs, alternating")
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--work", help="folder for the generated data (default: a new one under $TMPDIR)")
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "patchstore"))
    ap.add_argument("--keep", action="store_true", help="keep the generated frames and stores")
    args = ap.parse_args(argv)
    cli = os.path.abspath(args.cli)
    work = tempfile.mkdtemp(prefix="convert-bench-", dir=args.work)
    frames = os.path.join(work, "frames")
    rows = os.path.join(work, "rows.ps")
    fields = [f"--field={k}={v}" for k, v in TEMPLATES.items()]
    try:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_frames.py"), frames, "--videos", "1",
                        "--frames", str(args.frames), "--height", str(args.height), "--width", str(args.width)],
                       check=True, capture_output=True)
        gen = time.perf_counter() - t0
        src_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(frames) for f in fs)
        evict([frames])
        ingest_rows, _ = run([cli, "-q", "ingest", "images", rows, "--root", frames] + fields)
        results = {"copy": [], "re-ingest": []}
        cpu = {"copy": [], "re-ingest": []}
        outs = {}
        for r in range(args.rounds):
            out = os.path.join(work, f"copy-{r}.ps")
            evict([frames, rows])
            dt, c = run([cli, "-q", "copy", rows, out, "--layout", "tiles", "--encoding", "compact"])
            results["copy"].append(dt)
            cpu["copy"].append(c)
            outs["copy"] = out
            out = os.path.join(work, f"ingest-{r}.ps")
            evict([frames, rows] + [os.path.join(work, f"copy-{r}.ps")])
            dt, c = run([cli, "-q", "ingest", "images", out, "--root", frames, "--layout", "tiles", "--encoding",
                         "compact"] + fields)
            results["re-ingest"].append(dt)
            cpu["re-ingest"].append(c)
            outs["re-ingest"] = out
        same_reads(outs["copy"], outs["re-ingest"])
        same_reads(outs["copy"], rows)
        n = args.frames
        fmt = lambda v: " / ".join(f"{x:.1f}" for x in v)  # noqa: E731
        rate = lambda v: " / ".join(f"{n / x:.1f}" for x in v)  # noqa: E731
        speedup = " / ".join(f"{i / c:.1f}x" for c, i in zip(results["copy"], results["re-ingest"]))
        cpu_speedup = " / ".join(f"{i / c:.1f}x" for c, i in zip(cpu["copy"], cpu["re-ingest"]))
        date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
        cmd = "PYTHONPATH=build/bindings/python .venv/bin/python bench/convert_bench.py " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:]))
        print("### Conversion: `patchstore copy --layout tiles --encoding compact` vs re-ingesting the sources\n")
        print(f"{date}; this machine: `nproc` {os.cpu_count()}, "
              f"{ram_bytes() / 2**30:.1f} GiB RAM; other jobs shared the CPU.  ")
        print(f"`{cmd.strip()}`  ")
        print(f"{n} frames of {args.width}x{args.height} (rgb PNG, mask PNG, depth float32 EXR; "
              f"{src_bytes / 1e6:.0f} MB of files, generated in {gen:.0f} s), ingested as rows/float32 "
              f"({store_bytes(rows) / 1e6:.0f} MB, {ingest_rows:.1f} s). Each run starts with the frames and the "
              f"rows store evicted from the page cache (fsync + POSIX_FADV_DONTNEED); the copy's time includes "
              f"verifying every checksum of what it wrote. Both results read the same values as the rows "
              f"store (checked).\n")
        print("| conversion to tiles 64 + compact | seconds | frames/s | CPU seconds (user + sys) | store |")
        print("|---|---:|---:|---:|---:|")
        print(f"| `patchstore copy` from the rows/float32 store | {fmt(results['copy'])} | {rate(results['copy'])} "
              f"| {fmt(cpu['copy'])} | {store_bytes(outs['copy']) / 1e6:.0f} MB |")
        print(f"| `patchstore ingest images` of the sources again | {fmt(results['re-ingest'])} | "
              f"{rate(results['re-ingest'])} | {fmt(cpu['re-ingest'])} "
              f"| {store_bytes(outs['re-ingest']) / 1e6:.0f} MB |")
        print(f"\nre-ingesting took {speedup} the time of the copy (goal: >= 3x) and {cpu_speedup} its CPU.")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
