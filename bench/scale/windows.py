#!/usr/bin/env python3
"""Out-of-core window benchmark (issue "Scale 2"): random masked windows from a
store LARGER than RAM, from an uncached start, per layout and encoding.

    python bench/scale/windows.py [--build build] [--work /tmp/ps-windows]
        [--configs rows:float32,tiles:float32,rows:compact,tiles:compact]
        [--ram-factor 1.5] [--seconds 120] [--batch 16] [--threads 2]
        [--max-disk-gb 45] [--keep]

For each configuration (layout:encoding; layout rows, tiles or tilesN for
N-pixel tiles; tiles alone: ingest's default tile edge; the report names the
edge each store records) it ingests 1920x1080 rgb+mask+depth
frames (12 generated frames listed many times under distinct ids) until the
store is --ram-factor x MemTotal, evicts data.mdb from the page cache
(posix_fadvise(POSIX_FADV_DONTNEED), what vmtouch -e does), then runs one reader
process: PatchSampler(store, rgb/mask/depth, 256, require="mask",
num_threads=--threads).batch(--batch, out=...) for --seconds. Every 10 s it
records windows delivered and bytes read from the disk (/proc/diskstats,
all whole disks; the reader's own /proc/PID/io read_bytes as a
cross-check). Read amplification = disk bytes / stored bytes of the
windows delivered (a compact window stores fewer bytes than the float32 it
delivers; the float32 bytes delivered per second are also given). The
disk's own sequential and random (64 KiB / 256 KiB at queue depth 1/4/16)
read figures are measured in the same run on the first store's data.mdb.
Each store is deleted before the next is built (disk use stays below
--max-disk-gb). Writes bench/results/scale_windows.md and
bench/scale/windows.json.
"""
import argparse
import datetime
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from run import disk_read_stats, disk_sectors_read, evict, make_sources  # noqa: E402

PATCH = 256
FIELDS = ["rgb", "mask", "depth"]


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def ingest(patchstore, store, src, trip, n, layout, encoding):
    manifest = os.path.join(src, os.path.basename(store) + ".csv")
    with open(manifest, "w") as f:
        f.write("id,rgb,mask,depth\n")
        for i in range(n):
            r, m, d = trip[i % len(trip)]
            f.write(f"s{i:06d},{r},{m},{d}\n")
    cmd = [patchstore, "--quiet", "ingest", "images", store, "--manifest", manifest, "--no-sync"]
    if layout.startswith("tiles"):  # "tiles" (the default tile size) or "tiles64"
        cmd += ["--layout", "tiles"]
        if layout != "tiles":
            cmd += ["--tile-size", layout[len("tiles"):]]
    if encoding != "float32":
        cmd += ["--encoding", encoding]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    secs = time.perf_counter() - t0
    os.sync()
    return secs


def layout_label(patchstore, store):
    """"rows" or "tiles T", as the store records it (`patchstore info --json`), whatever the config asked."""
    out = subprocess.run([patchstore, "info", store, "--json"], check=True, capture_output=True, text=True).stdout
    f = json.loads(out)["fields"][0]
    return f"tiles {f['tile_size']}" if f["layout"] == "tiles" else "rows"


def store_bytes(store):
    return os.path.getsize(os.path.join(store, "data.mdb"))


# ---------------------------------------------------------------------------
# The disk itself, on a file that is not in the page cache.

def disk_probe(path, seconds=6.0):
    out = {}
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        # Sequential: 8 MiB reads from the start.
        t0 = time.perf_counter()
        done = 0
        while time.perf_counter() - t0 < seconds and done + (8 << 20) <= size:
            done += len(os.pread(fd, 8 << 20, done))
        out["sequential_MBps"] = done / (time.perf_counter() - t0) / 1e6
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: each pread is one request
        for block in (64 << 10, 256 << 10):
            for qd in (1, 4, 16):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total = [0] * qd
                stop = time.perf_counter() + seconds / 2

                def worker(k, block=block, qd=qd, stop=stop, total=total):
                    rng = random.Random(k * 7919 + block + qd)
                    while time.perf_counter() < stop:
                        off = rng.randrange(0, size - block) // 4096 * 4096
                        total[k] += len(os.pread(fd, block, off))

                ts = [threading.Thread(target=worker, args=(k,)) for k in range(qd)]
                t0 = time.perf_counter()
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                out[f"random_{block >> 10}k_qd{qd}_MBps"] = sum(total) / (time.perf_counter() - t0) / 1e6
    finally:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return out


# ---------------------------------------------------------------------------
# The reader: a child process printing one JSON line per interval.

READER = r"""
import json, sys, time
import numpy as np
import patchstore
store, seconds, batch, threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
interval = float(sys.argv[5])
kw = {} if sys.argv[6] == '-' else {'prefetch': int(sys.argv[6])}
def io_read():
    with open('/proc/self/io') as f:
        for line in f:
            if line.startswith('read_bytes:'):
                return int(line.split()[1])
t0 = time.perf_counter()
sp = patchstore.PatchSampler(store, ['rgb', 'mask', 'depth'], %d, require='mask', seed=0, num_threads=threads, **kw)
out = {f: np.empty((batch, c, %d, %d), np.float32) for f, c in (('rgb', 3), ('mask', 1), ('depth', 1))}
print(json.dumps({'event': 'open', 's': time.perf_counter() - t0, 'io': io_read()}), flush=True)
n = 0
next_t = t0 + interval
while True:
    sp.batch(batch, out=out)
    n += batch
    now = time.perf_counter()
    if now >= next_t:
        print(json.dumps({'event': 'tick', 't': now - t0, 'windows': n, 'io': io_read()}), flush=True)
        next_t += interval
    if now - t0 >= seconds:
        break
print(json.dumps({'event': 'end', 't': time.perf_counter() - t0, 'windows': n, 'io': io_read(),
                  'candidates': getattr(sp, 'candidate_stats', None)}), flush=True)
""" % (PATCH, PATCH, PATCH)


def run_reader(store, seconds, batch, threads, interval, env, stored_window_bytes, prefetch="-"):
    d0 = disk_sectors_read()
    p = subprocess.Popen([sys.executable, "-c", READER, store, str(seconds), str(batch), str(threads), str(interval),
                          prefetch],
                         stdout=subprocess.PIPE, text=True, env=env)
    ticks = []
    last = {"t": 0.0, "windows": 0, "disk": 0, "stats": disk_read_stats()}
    opened = None
    for line in p.stdout:
        ev = json.loads(line)
        disk = disk_sectors_read() - d0
        stats = disk_read_stats()
        if ev["event"] == "open":
            opened = {"s": ev["s"], "disk": disk}
            last["disk"] = disk
            last["stats"] = stats
            continue
        dt = ev["t"] - last["t"]
        if ev["event"] == "end":
            final = ev
            if dt < 0.5 * interval:  # the last interval was just reported
                continue
        dw = ev["windows"] - last["windows"]
        dd = disk - last["disk"]
        nreads = stats["reads"] - last["stats"]["reads"]
        tick = {"t": ev["t"], "windows_per_s": dw / dt if dt > 0 else 0.0,
                "disk_MBps": dd / dt / 1e6 if dt > 0 else 0.0,
                "amplification": dd / (dw * stored_window_bytes) if dw else None,
                # the disk's view: mean request size and mean reads in flight
                "request_KiB": (stats["bytes"] - last["stats"]["bytes"]) / nreads / 1024 if nreads else None,
                "reads_in_flight": (stats["read_ms"] - last["stats"]["read_ms"]) / (dt * 1000) if dt > 0 else None}
        ticks.append(tick)
        amp = tick["amplification"]
        print(f"    t={ev['t']:6.1f} s  {tick['windows_per_s']:8.1f} windows/s  disk {tick['disk_MBps']:7.1f} MB/s  "
              f"amplification {amp if amp is None else round(amp, 2)}  "
              f"requests {tick['request_KiB'] or 0:.0f} KiB, {tick['reads_in_flight'] or 0:.1f} in flight",
              flush=True)
        last = {"t": ev["t"], "windows": ev["windows"], "disk": disk, "stats": stats}
    if p.wait() != 0:
        raise RuntimeError("reader failed")
    total_disk = disk_sectors_read() - d0
    w = final["windows"]
    return {
        "open_s": opened["s"] if opened else None,
        "seconds": final["t"],
        "windows": w,
        "windows_per_s": w / final["t"],
        "disk_bytes": total_disk,
        "process_read_bytes": final["io"],
        "amplification": total_disk / (w * stored_window_bytes) if w else None,
        "float32_MBps_delivered": w * PATCH * PATCH * 5 * 4 / final["t"] / 1e6,
        "candidates": final.get("candidates"),
        "ticks": ticks,
    }


def stored_window_bytes(encoding):
    # rgb + mask + depth of one window as stored: float32 everywhere, or
    # compact: uint8 rgb + uint8 mask + float32 depth.
    px = PATCH * PATCH
    return px * 5 * 4 if encoding == "float32" else px * (3 + 1 + 4)


def report(res, args, path):
    lines = [
        "### Scale: random windows from a store larger than RAM, per layout and encoding",
        "",
        f"`python bench/scale/windows.py`. Machine: {res['machine']}; {res['date']}; "
        f"`read_ahead_kb` {res['read_ahead_kb']}; "
        f"command: `{res['command']}`. Each store is about {args.ram_factor}x RAM, built, evicted from the page "
        "cache (`posix_fadvise(POSIX_FADV_DONTNEED)`, as `vmtouch -e`), read by one process, then deleted.",
        "",
        "The disk, measured in the same run (file not in the page cache, one request per read): sequential "
        f"{res['disk']['sequential_MBps']:.0f} MB/s; random 64 KiB "
        + " / ".join(f"{res['disk'][f'random_64k_qd{q}_MBps']:.0f}" for q in (1, 4, 16))
        + " MB/s and 256 KiB "
        + " / ".join(f"{res['disk'][f'random_256k_qd{q}_MBps']:.0f}" for q in (1, 4, 16))
        + " MB/s at queue depth 1 / 4 / 16.",
        "",
        f"Random 256x256 rgb+mask+depth windows, `require=\"mask\"`, batches of {args.batch}, "
        f"`num_threads={args.threads}`, {args.seconds:.0f} s from an uncached start:",
        "",
        "| layout | encoding | prefetch (batches) | store (GB) | frames | MB/frame | ingest (s) | windows/s "
        "| windows/s per 10 s (min-max) | disk MB/s | read amplification | float32 MB/s delivered |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in res["runs"]:
        m = r["read"]
        per = [t["windows_per_s"] for t in m["ticks"][:-1]] or [m["windows_per_s"]]
        lines.append(
            f"| {r['layout']} | {r['encoding']} | {r.get('prefetch', '-')} | {r['store_bytes'] / 1e9:.1f} | "
            f"{r['frames']} | "
            f"{r['store_bytes'] / r['frames'] / 1e6:.1f} | {r['ingest_s']:.0f} | **{m['windows_per_s']:.0f}** | "
            f"{min(per):.0f}-{max(per):.0f} | {m['disk_bytes'] / m['seconds'] / 1e6:.0f} | "
            f"**{m['amplification']:.2f}x** | {m['float32_MBps_delivered']:.0f} |")
    lines.append("")
    lines.append("Read amplification: bytes read from the disk (/proc/diskstats) / stored bytes of the windows "
                 "delivered (float32: 1.31 MB per window; compact: 0.52 MB).")
    lines.append("")
    lines.append("Drawing a window (`reader/sampler.h`): uniform candidate windows, the first that qualifies. "
                 "Out of memory a candidate is decided by the mask's block counts (FORMAT.md \"Mask block counts\": "
                 "32x32-block counts, 12 KiB per frame on disk) where their bounds tell, else by counting its own "
                 "mask pixels (a few tile rows of a tiled mask; a page per row of a row-major one), so no whole mask "
                 "is read. Stores without block counts (written before them) read a row-major frame's whole mask "
                 "once on its first visit instead. Later, windows increasingly come from the page cache (the store "
                 "is 1.5x RAM), which is why amplification falls below 1 and the rate climbs (the high end). "
                 "Read-ahead requests every run of a window with a page out of memory, and the batch after next is "
                 "drawn while the next one is read.")
    stats = [(r["layout"], r["encoding"] + ("" if r.get("prefetch", "-") == "-" else f" prefetch {r['prefetch']}"),
              r["read"].get("candidates")) for r in res["runs"]]
    if any(c for _, _, c in stats):
        lines.append("")
        lines.append("Candidates decided (reader process, whole run): " + "; ".join(
            f"{lay} {enc}: {c['by_blocks']} by block counts, {c['by_counting']} by counting mask pixels, "
            f"{c['by_lists']} by window lists" for lay, enc, c in stats if c) + ".")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def read_runs(res, args, env, store, layout, encoding, frames, size, secs):
    """One reader run per --prefetch value on `store`, each from an uncached start."""
    if "disk" not in res:
        print("  measuring the disk on data.mdb", flush=True)
        res["disk"] = disk_probe(os.path.join(store, "data.mdb"))
        print("  " + json.dumps({k: round(v) for k, v in res["disk"].items()}), flush=True)
    label = layout_label(os.path.join(args.build, "patchstore"), store)
    for pf in args.prefetch.split(","):
        evict(store)
        if pf != "-":
            print(f"  prefetch={pf}", flush=True)
        read = run_reader(store, args.seconds, args.batch, args.threads, args.interval, env,
                          stored_window_bytes(encoding), pf)
        print(f"  {read['windows_per_s']:.0f} windows/s, amplification {read['amplification']:.2f}x", flush=True)
        res["runs"].append({"layout": label, "encoding": encoding, "prefetch": pf, "frames": frames,
                            "store_bytes": size, "ingest_s": secs, "read": read})
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default="/tmp/ps-windows")
    ap.add_argument("--configs", default="rows:float32,tiles:float32,rows:compact,tiles:compact")
    ap.add_argument("--ram-factor", type=float, default=1.5)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--max-disk-gb", type=float, default=45)
    ap.add_argument("--frames", type=int, default=0, help="frames per store (default: from --ram-factor)")
    ap.add_argument("--prefetch", default="-",
                    help="comma-separated PatchSampler prefetch values (batches ahead; 0: off) to run on each "
                         "store in turn, evicting it before each; '-' (default): the library's default")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--reuse", action="store_true",
                    help="read a store left by an earlier --keep run of the same configuration instead of "
                         "ingesting it again")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/scale_windows.md"))
    ap.add_argument("--json", default=os.path.join(HERE, "windows.json"))
    args = ap.parse_args()
    patchstore = os.path.join(args.build, "patchstore")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "bindings"),  # the package and its compiled modules
                                         os.path.join(args.build, "bindings/python"), env.get("PYTHONPATH", "")])
    os.makedirs(args.work, exist_ok=True)
    src, trip = make_sources(args.work, 1080, 1920, 3, 4, 7)
    target = args.ram_factor * mem_total()
    try:
        with open("/sys/block/vda/queue/read_ahead_kb") as f:
            ra = f.read().strip()
    except OSError:
        ra = "?"
    res = {"machine": f"{os.cpu_count()} cores, {mem_total() / 2**30:.0f} GiB, {platform.platform()}",
           "date": datetime.date.today().isoformat(), "read_ahead_kb": ra,
           "command": "python bench/scale/windows.py " + " ".join(sys.argv[1:]), "runs": []}
    for cfg in args.configs.split(","):
        layout, encoding = cfg.split(":")
        store = os.path.join(args.work, f"{layout}-{encoding}.ps")
        sidecar = store + ".json"
        if args.reuse and os.path.exists(sidecar) and os.path.exists(os.path.join(store, "data.mdb")):
            with open(sidecar) as f:
                built = json.load(f)
            frames, secs, size = built["frames"], built["ingest_s"], store_bytes(store)
            print(f"{cfg}: reusing {store} ({frames} frames, {size / 1e9:.1f} GB)", flush=True)
            read_runs(res, args, env, store, layout, encoding, frames, size, secs)
            continue
        # Bytes per frame from a 12-frame store of this configuration.
        probe = os.path.join(args.work, f"probe-{layout}-{encoding}.ps")
        shutil.rmtree(probe, ignore_errors=True)
        ingest(patchstore, probe, src, trip, len(trip), layout, encoding)
        per_frame = store_bytes(probe) / len(trip)
        shutil.rmtree(probe)
        frames = args.frames or int(target / per_frame) + 1
        if frames * per_frame > args.max_disk_gb * 1e9:
            raise SystemExit(f"{cfg}: {frames} frames would take {frames * per_frame / 1e9:.1f} GB "
                             f"(> --max-disk-gb {args.max_disk_gb})")
        shutil.rmtree(store, ignore_errors=True)
        print(f"{cfg}: ingesting {frames} frames (~{per_frame / 1e6:.1f} MB each) into {store}", flush=True)
        secs = ingest(patchstore, store, src, trip, frames, layout, encoding)
        size = store_bytes(store)
        print(f"  {size / 1e9:.1f} GB in {secs:.0f} s", flush=True)
        with open(sidecar, "w") as f:
            json.dump({"frames": frames, "ingest_s": secs}, f)
        read_runs(res, args, env, store, layout, encoding, frames, size, secs)
        if not args.keep:
            shutil.rmtree(store)
            os.remove(sidecar)
    report(res, args, args.out)
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
