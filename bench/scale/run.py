#!/usr/bin/env python3
"""Scale benchmark: what opening and starting to read a store costs when the
store is NOT in the page cache (the normal case once a store is larger than
RAM), in seconds and in bytes read from storage.

    python bench/scale/run.py [--build build] [--work /tmp/ps-scale]
                              [--big-frames 720] [--small-samples 20000] [--keep]

Builds, one after the other (to bound disk use), (a) a store of --big-frames
1920x1080 rgb+mask+depth frames (12 generated frames listed many times under
distinct ids in a manifest; ~41.5 MB of float32 each, so 720 frames are
larger than this machine's RAM) and (b) a store of --small-samples 256x192
samples. For each, evicts data.mdb from the page cache (posix_fadvise(POSIX_FADV_DONTNEED),
what vmtouch -e does) before every cold measurement and counts
the bytes each measured process read from storage (getrusage of children:
ru_inblock, the same counter as /proc/PID/io read_bytes), plus the system's
/proc/diskstats sectors as a cross-check. Warm rows repeat the operation
with the pages it touched still cached. Writes bench/results/scale.md (a
results file linked from the README) and bench/scale/results.json; deletes the stores unless --keep.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def disk_sectors_read():
    """Bytes read by all whole disks since boot (/proc/diskstats, sectors of 512 bytes)."""
    total = 0
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if not p[2].startswith(("loop", "ram")) and os.path.exists(f"/sys/block/{p[2]}"):
                total += int(p[5])
    return total * 512


def disk_read_stats():
    """Reads completed, bytes read and milliseconds spent by reads, summed over whole disks (/proc/diskstats).

    Between two calls: bytes / reads is the mean request size; read milliseconds / elapsed
    milliseconds is the mean number of reads in flight (the queue depth the disk saw).
    """
    reads = sectors = ms = 0
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if not p[2].startswith(("loop", "ram")) and os.path.exists(f"/sys/block/{p[2]}"):
                reads += int(p[3])
                sectors += int(p[5])
                ms += int(p[6])
    return {"reads": reads, "bytes": sectors * 512, "read_ms": ms}


def evict(store):
    """Drops data.mdb's pages from the page cache: posix_fadvise(POSIX_FADV_DONTNEED), what `vmtouch -e` does.

    Only clean pages go: callers sync after writing (ingest then os.sync()).
    """
    fd = os.open(os.path.join(store, "data.mdb"), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Measured:
    """Runs commands as children and reports wall time and bytes read from storage."""

    def __init__(self, env):
        self.env = env

    def run(self, cmds, parse_seconds=False, watch_memory=False):
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        d0 = disk_sectors_read()
        t0 = time.perf_counter()
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env, text=True)
                 for c in cmds]
        peak = {"anon": 0, "file": 0}
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                for p in procs:
                    try:
                        with open(f"/proc/{p.pid}/status") as f:
                            for line in f:
                                if line.startswith("RssAnon:"):
                                    peak["anon"] = max(peak["anon"], int(line.split()[1]) * 1024)
                                elif line.startswith("RssFile:"):
                                    peak["file"] = max(peak["file"], int(line.split()[1]) * 1024)
                    except OSError:
                        pass
                stop.wait(0.05)

        th = threading.Thread(target=watch) if watch_memory else None
        if th:
            th.start()
        outs = [p.communicate() for p in procs]
        wall = time.perf_counter() - t0
        if th:
            stop.set()
            th.join()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        d1 = disk_sectors_read()
        for p, (_, e) in zip(procs, outs):
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(cmds[0])} failed ({p.returncode}): {e.strip()[-2000:]}")
        secs = [json.loads(o.strip().splitlines()[-1])["seconds"] for o, _ in outs] if parse_seconds else [wall]
        res = {"wall_s": wall, "op_s_max": max(secs), "read_bytes": (ru1.ru_inblock - ru0.ru_inblock) * 512,
               "disk_bytes": d1 - d0}
        if watch_memory:
            res["peak_rss_anon"] = peak["anon"]
            res["peak_rss_file"] = peak["file"]
        return res


def make_sources(work, height, width, videos, frames, seed):
    src = os.path.join(work, f"src_{height}x{width}")
    if not os.path.isdir(src):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools/make_frames.py"), src, "--videos", str(videos),
                        "--frames", str(frames), "--height", str(height), "--width", str(width), "--seed",
                        str(seed)], check=True)
    rgbs = sorted(glob.glob(os.path.join(src, "*/render/rgb/*.png")))
    trip = []
    for rgb in rgbs:
        video = rgb.split(os.sep)[-4]
        frame = os.path.splitext(os.path.basename(rgb))[0]
        trip.append((f"{video}/render/rgb/{frame}.png", f"{video}/render/masks/{frame}.png",
                     f"{video}/render/depth/{frame}.exr"))
    return src, trip


def build_store(patchstore, work, name, src, trip, n):
    store = os.path.join(work, name + ".ps")
    manifest = os.path.join(src, name + ".csv")
    with open(manifest, "w") as f:
        f.write("id,rgb,mask,depth\n")
        for i in range(n):
            r, m, d = trip[i % len(trip)]
            f.write(f"s{i:06d},{r},{m},{d}\n")
    t0 = time.perf_counter()
    subprocess.run([patchstore, "--quiet", "ingest", "images", store, "--manifest", manifest, "--no-sync"],
                   check=True, stdout=subprocess.DEVNULL)
    secs = time.perf_counter() - t0
    os.sync()  # --no-sync left GBs of dirty pages: write them now, not during the measurements
    return store, secs


def measure_store(m, patchstore, store, label, with_verify, patch):
    py = sys.executable
    probe = os.path.join(HERE, "probe.py")
    pa = ["--patch", str(patch)]
    ops = [
        ("open (Python `patchstore.open`, len, ids)", [[py, probe, "open", store] + pa], True),
        ("`patchstore info`", [[patchstore, "info", store]], False),
        ("`patchstore ls`", [[patchstore, "ls", store]], False),
        ("`PatchSampler(require=\"mask\")`, 1 process", [[py, probe, "sampler", store] + pa], True),
        ("`PatchSampler(require=\"mask\")`, 4 processes at once", [[py, probe, "sampler", store] + pa] * 4, True),
        ("sampler + first batch of 16 windows", [[py, probe, "first_batch", store] + pa], True),
        ("DataLoader(PatchDataset, 2 workers) to first batch", [[py, probe, "dataloader", store] + pa], True),
    ]
    rows = []
    for name, cmds, parse in ops:
        os.sync()
        evict(store)
        cold = m.run(cmds, parse_seconds=parse)
        warm = m.run(cmds, parse_seconds=parse)
        rows.append({"store": label, "op": name, "cold": cold, "warm": warm})
        print(f"  {name}: cold {cold['op_s_max']:.3f} s {cold['read_bytes'] / 1e6:.1f} MB; "
              f"warm {warm['op_s_max']:.3f} s", flush=True)
    if with_verify:
        evict(store)
        v = m.run([[patchstore, "verify", store]], watch_memory=True)
        rows.append({"store": label, "op": "`patchstore verify` (whole store)", "cold": v, "warm": None})
        print(f"  verify: {v['wall_s']:.1f} s, read {v['read_bytes'] / 1e9:.2f} GB, peak RssAnon "
              f"{v['peak_rss_anon'] / 1e6:.0f} MB, RssFile {v['peak_rss_file'] / 1e6:.0f} MB", flush=True)
    return rows


def fmt_bytes(b):
    if b is None:
        return ""
    if b >= 1e9:
        return f"{b / 1e9:.2f} GB"
    if b >= 1e6:
        return f"{b / 1e6:.1f} MB"
    return f"{b / 1e3:.0f} kB"


def report(results, args):
    lines = ["### Scale: opening and starting to read a store that is not in the page cache", ""]
    lines.append(f"`{' '.join(['python', 'bench/scale/run.py'] + args.argv)}` on {results['machine']}, "
                 f"{results['date']}; read_ahead_kb {results['read_ahead_kb']}. Cold: data.mdb evicted from the "
                 "page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`, as `vmtouch -e`) before the operation; "
                 "bytes are what the measured processes read from storage (ru_inblock = /proc/PID/io "
                 "read_bytes). Seconds are the operation itself (after `import patchstore`; the slowest "
                 "process for the 4-process row) for Python rows, the whole command for CLI rows.")
    lines.append("")
    for st in results["stores"]:
        lines.append(f"* **{st['label']}**: {st['samples']} samples, data.mdb {fmt_bytes(st['file_bytes'])}, "
                     f"ingest {st['ingest_s']:.0f} s.")
    lines.append("")
    lines.append("| store | operation | cold: seconds | cold: read from storage | warm: seconds |")
    lines.append("|---|---|---:|---:|---:|")
    for r in results["rows"]:
        c, w = r["cold"], r["warm"]
        extra = ""
        if "peak_rss_anon" in c:
            extra = (f" (peak anonymous memory {fmt_bytes(c['peak_rss_anon'])}, mapped file pages "
                     f"{fmt_bytes(c['peak_rss_file'])})")
        warm = "" if w is None else f"{w['op_s_max']:.3f}"
        lines.append(f"| {r['store']} | {r['op']}{extra} | {c['op_s_max']:.3f} | {fmt_bytes(c['read_bytes'])} | "
                     f"{warm} |")
    lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default="/tmp/ps-scale")
    ap.add_argument("--big-frames", type=int, default=720)
    ap.add_argument("--small-samples", type=int, default=20000)
    ap.add_argument("--keep", action="store_true", help="keep the stores")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/scale.md"))
    args = ap.parse_args()
    args.argv = sys.argv[1:]
    patchstore = os.path.join(os.path.abspath(args.build), "patchstore")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "bindings"),  # the package and its compiled modules
                                         os.path.join(os.path.abspath(args.build), "bindings/python"),
                                         env.get("PYTHONPATH", "")])
    os.makedirs(args.work, exist_ok=True)
    m = Measured(env)
    try:
        ra = open("/sys/block/vda/queue/read_ahead_kb").read().strip()
    except OSError:
        ra = "?"
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    results = {"machine": f"{os.cpu_count()} cores, {ram_gib:.0f} GiB, {platform.platform()}",
               "date": datetime.date.today().isoformat(), "read_ahead_kb": ra, "stores": [], "rows": []}
    plans = []
    if args.big_frames > 0:
        plans.append(("big", f"{args.big_frames} frames 1920x1080 rgb+mask+depth, 256x256 windows", 1080, 1920, 2,
                      6, args.big_frames, False, 256))
    if args.small_samples > 0:
        plans.append(("small", f"{args.small_samples} samples 256x192 rgb+mask+depth, 128x128 windows", 192, 256,
                      4, 5, args.small_samples, True, 128))
    for name, label, h, w, videos, frames, n, with_verify, patch in plans:
        src, trip = make_sources(args.work, h, w, videos, frames, seed=7)
        print(f"building {label} ...", flush=True)
        store, secs = build_store(patchstore, args.work, name, src, trip, n)
        size = os.path.getsize(os.path.join(store, "data.mdb"))
        results["stores"].append({"label": label, "samples": n, "file_bytes": size, "ingest_s": secs})
        print(f"  {fmt_bytes(size)} in {secs:.0f} s", flush=True)
        try:
            results["rows"] += measure_store(m, patchstore, store, label, with_verify, patch)
        finally:
            if not args.keep:
                shutil.rmtree(store, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    text = report(results, args)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
