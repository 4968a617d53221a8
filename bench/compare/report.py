"""results.json -> RESULTS.md (every number and sentence with a number in it is generated)."""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any, Dict, List, Optional, Tuple

PEER_EXCLUDE = {"null", "ram_crop", "ram_slices"}


def _f(x: Optional[float], digits: int = 3) -> str:
    """A figure with about `digits` significant digits, thousands separated."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    d = max(0, digits - 1 - int(f"{ax:e}".split("e")[1]))
    return f"{x:,.{d}f}"


def _ratio(ps: Optional[float], other: Optional[float]) -> str:
    if not ps or not other:
        return "—"
    r = ps / other
    return f"{_f(r)}×"


def _mb(x: Optional[float]) -> str:
    return "—" if x is None else _f(x)


def _run(m: Dict[str, Any], name: str) -> Optional[Dict[str, Any]]:
    r = m.get("runs", {}).get(name)
    return r if r and "samples_per_s" in r else None


def _rate(m: Optional[Dict[str, Any]], name: str) -> Optional[float]:
    if m is None:
        return None
    r = _run(m, name)
    return r["samples_per_s"] if r else None


def _find(sec: Dict[str, Any], key: str) -> Optional[Dict[str, Any]]:
    for m in sec.get("methods", []):
        if m.get("key") == key:
            return m
    return None


def _status(m: Dict[str, Any], name: str) -> str:
    if "unavailable" in m:
        return m["unavailable"]
    if "error" in m:
        return m["error"]
    r = m.get("runs", {}).get(name)
    if r is None:
        return "not run"
    return r.get("error", "")


def _mem(r: Optional[Dict[str, Any]], where: str) -> str:
    if not r:
        return "—"
    if where == "worker":
        if not r.get("workers_seen"):
            return "—"
        return f"{_f(r['worker_uss_mb'])} ({_f(r['worker_anon_mb'])})"
    return f"{_f(r['main_uss_mb'])} ({_f(r['main_anon_mb'])})"


def _spread(*rs: Optional[Dict[str, Any]]) -> str:
    parts = [f"{r['spread']:.0%}" for r in rs if r and r.get("spread") is not None]
    return " / ".join(parts) if parts else "—"


def _foreign(*rs: Optional[Dict[str, Any]]) -> str:
    parts = [f"{r['foreign_cores']:.1f}" for r in rs if r and r.get("foreign_cores") is not None]
    return " / ".join(parts) if parts else "—"


def _table(sec: Dict[str, Any], variants: List[Tuple[str, str, str]], ps_key: str,
           ps_variant: str) -> Tuple[List[str], List[str]]:
    """Rows for (method key, variant, row label) and footnotes."""
    ps = _find(sec, ps_key)
    ps_in = _rate(ps, f"{ps_variant}|inproc" if ps_variant else "inproc")
    ps_dl = _rate(ps, f"{ps_variant}|dl2" if ps_variant else "dl2")
    lines = ["| # | method | in process: samples/s | MB/s | patchstore ÷ this | DataLoader (2 workers): samples/s "
             "| MB/s | patchstore ÷ this | peak USS per worker, MB (anon) | USS in process, MB (anon) | "
             "spread in / DL | other load, cores in / DL |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes: List[str] = []
    n = 0
    for key, variant, label in variants:
        m = _find(sec, key)
        if m is None:
            continue
        n += 1
        pre = f"{variant}|" if variant else ""
        ri, rd = _run(m, pre + "inproc"), _run(m, pre + "dl2")
        cells_in = [_f(ri["samples_per_s"]), _mb(ri["mb_per_s"]), _ratio(ps_in, ri["samples_per_s"])] if ri else None
        cells_dl = [_f(rd["samples_per_s"]), _mb(rd["mb_per_s"]), _ratio(ps_dl, rd["samples_per_s"])] if rd else None
        why_in = _status(m, pre + "inproc") if ri is None else ""
        why_dl = _status(m, pre + "dl2") if rd is None else ""
        if cells_in is None:
            cells_in = ["n/a" if why_in == "not run" else "**failed**", "", ""]
        if cells_dl is None:
            cells_dl = ["n/a" if why_dl == "not run" else "**failed**", "", ""]
        if "unavailable" in m:
            cells_in = ["*not available in this build*", "", ""]
            cells_dl = ["", "", ""]
        bold = "**" if m.get("is_patchstore") else ""
        lines.append(f"| {n} | {bold}{label}{bold} | " + " | ".join(cells_in) + " | " + " | ".join(cells_dl)
                     + f" | {_mem(rd, 'worker')} | {_mem(ri, 'main')} | {_spread(ri, rd)} | {_foreign(ri, rd)} |")
        bits = [m.get("note", "")]
        if m.get("order"):
            bits.append(f"windows/order: {m['order']}")
        if m.get("check"):
            bits.append(f"output check: {m['check']}")
        for nm, why in (("in process", why_in), ("DataLoader", why_dl)):
            if why and why != "not run" and "unavailable" not in m:
                bits.append(f"{nm} failed: `{why}`")
        if "unavailable" in m:
            bits.append(m["unavailable"])
        if key == "seed_recommended" and rd and "cache_misses_total" in rd:
            bits.append(f"files decoded by the DataLoader run's workers in all: {rd['cache_misses_total']} "
                        f"(3 files per frame per worker)")
        notes.append(f"{n}. {label}: " + "; ".join(b for b in bits if b) + ".")
    return lines, notes


def _ingest_rows(wl: str, sec: Dict[str, Any], payload: Optional[float]) -> List[str]:
    rows = []
    seen = set()
    gen = sec.get("gen", {})
    if wl == "frames" and "bytes" in gen:
        rows.append(f"| frames | source files (PNG + PNG + EXR, tools/make_frames.py) | — | {_f(gen['bytes'] / 1e6)} | "
                    f"{_f(gen['bytes'] / payload) if payload else '—'} | the input |")
    for m in sec.get("methods", []):
        p = m.get("prepare") or {}
        fmt = m.get("fmt")
        if not fmt or fmt in seen or "bytes" not in p:
            continue
        seen.add(fmt)
        secs = p.get("seconds")
        if secs is None and wl == "volumes" and m.get("key") == "h5_hws_gzip":
            secs = gen.get("seconds")  # the seed's file is the source: its write time is the 'gen' stage
        rows.append(f"| {wl} | {m['label']} | {_f(secs) if secs is not None else '—'} | {_f(p['bytes'] / 1e6)} | "
                    f"{_f(p['bytes'] / payload) if payload else '—'} | {p.get('note', '')} |")
    return rows


def _goal(text: str, ratio: Optional[float], need: float, detail: str, ceiling: Optional[float] = None) -> str:
    """A goal row; `ceiling`: the ratio a loader running at single-thread memcpy speed would reach."""
    c = f"{_f(ceiling)}×" if ceiling else "—"
    if ratio is None:
        return f"| {text} | not measured | — | {c} | {detail} |"
    ok = "**met**" if ratio >= need else "**not met**"
    return f"| {text} | {_f(ratio)}× | {ok} | {c} | {detail} |"


def render(res: Dict[str, Any]) -> str:
    out: List[str] = []
    cfg = res.get("config", {})
    mach = res.get("machine", {})
    frames = res.get("frames", {})
    vols = res.get("volumes", {})
    quick = cfg.get("quick")
    out.append("# patchstore side by side with the tools users would pick instead")
    out.append("")
    out.append(f"Generated by `bench/compare/run.py` on {res.get('date')} in {_f(res.get('total_s'))} s — do not edit "
               f"by hand; rerun the command below. Machine-readable: `results.json` beside this file.")
    out.append("")
    out.append(f"* **Command:** `{res.get('command')}`{' (quick mode: small data, short repeats)' if quick else ''}")
    caches = ", ".join(f"{k} {v}" for k, v in mach.get("caches", {}).items())
    out.append(f"* **Machine:** {mach.get('cpu')}, {mach.get('cores')} cores, {mach.get('ram_gib')} GiB RAM"
               f"{', ' + caches if caches else ''}; Linux {mach.get('kernel')}; Python {mach.get('python')}; "
               f"no GPU.")
    la0, la1 = res.get("loadavg_start", [None])[0], res.get("loadavg_end", [None])[0]
    loads = [x for sec in (frames, vols) for m in sec.get("methods", []) for r in m.get("runs", {}).values()
             for x in r.get("loadavg", [])]
    if loads:
        out.append(f"* **Load average (1 min):** {_f(la0)} at the start, {_f(la1)} at the end, {_f(min(loads))}–"
                   f"{_f(max(loads))} around the measurements ({mach.get('cores')} cores).")
    fr_gen, vo_gen = frames.get("gen", {}), vols.get("gen", {})
    fseq, vseq = frames.get("seq", {}), vols.get("seq", {})
    n_frames = fr_gen.get("frames") or (cfg.get("videos", 0) * cfg.get("frames_per_video", 0))
    out.append(f"* **Frames:** {n_frames} frames of {cfg.get('width')}×{cfg.get('height')} (rgb PNG, mask PNG "
               f"with ~5% mask pixels, depth EXR), {cfg.get('patch')}×{cfg.get('patch')} windows holding ≥1 mask "
               f"pixel, k={cfg.get('k')} per item, batches of {cfg.get('items_per_batch', 4) * cfg.get('k', 4)} "
               f"windows; shared windows: {fseq.get('windows_source', '—')}, "
               f"{fseq.get('windows_checked', '—')} checked against the decoded masks, "
               f"{fseq.get('windows_without_mask_pixel', '—')} without a mask pixel.")
    depths = vo_gen.get("depths")
    out.append(f"* **Volumes:** {cfg.get('patients')} patients of {cfg.get('vol_hw')}×{cfg.get('vol_hw')}×S "
               f"(S = {min(depths) if depths else cfg.get('slices_min')}–"
               f"{max(depths) if depths else cfg.get('slices_max')}), groups MR, CT, MASK, written as the seed's "
               f"HDF5 file ((H,W,S) float32, gzip, h5py's automatic chunks {vseq.get('gzip_chunks', '')}); "
               f"batches of {cfg.get('vol_batch')}; 2.5D = {2 * cfg.get('context', 2) + 1} neighbouring slices.")
    out.append(f"* **Timing:** after a warm-up, {cfg.get('repeats')} repeats of ≈{cfg.get('target_s')} s each "
               f"(fewer, never under 3, for methods slower than {cfg.get('max_run_s')} s per run); the figure is "
               f"the median; 'spread' = (max − min) / median over the repeats.")
    out.append("")
    out.append("How to read the tables:")
    out.append("")
    out.append(f"* **A sample** is the unit of every rate. Frames: one window with its rgb, mask and depth "
               f"(5×{cfg.get('patch')}×{cfg.get('patch')} float32 = "
               f"{_f(5 * cfg.get('patch', 256) ** 2 * 4 / 1e6)} MB). Volumes: one slice of MR, CT and MASK "
               f"({_f(3 * cfg.get('vol_hw', 256) ** 2 * 4 / 1e6)} MB); 2.5D: 5 slices of each "
               f"({_f(15 * cfg.get('vol_hw', 256) ** 2 * 4 / 1e6)} MB). MB = 10⁶ bytes of float32 output.")
    out.append("* **In process** = `DataLoader(num_workers=0)` (or the library's own loader in the training "
               "process), torch intra-op threads set to 1 in the measuring process as torch does in every "
               "DataLoader worker. **DataLoader** = `DataLoader(num_workers=2)`, fork start method unless a note "
               "says otherwise, prefetch_factor 2, no pinned memory (no GPU).")
    me = res.get("malloc_env") or {}
    if any(me.values()):
        out.append(f"* **Allocator:** every measuring process runs with glibc's MALLOC_MMAP_THRESHOLD_="
                   f"{me.get('MALLOC_MMAP_THRESHOLD_')} and MALLOC_TRIM_THRESHOLD_={me.get('MALLOC_TRIM_THRESHOLD_')}: "
                   "with glibc's adaptive default, a process allocating MB-sized batches lands by chance in a regime "
                   "that reuses heap memory or one that maps, faults and zeroes every batch, and the same method "
                   "measured up to 7× apart in back-to-back runs. The fixed thresholds put every method in the "
                   "reuse regime; methods that reuse their own buffers (BatchLoader) do not depend on it.")
    out.append("* **other load**: cores' worth of CPU that processes outside the measurement (or the hypervisor) "
               "used during the timed repeats, from /proc/stat minus the measuring process tree. Above ~0.3 the "
               "row ran on a shared CPU and reads low.")
    out.append("* **patchstore ÷ this**: how many times patchstore's figure in the same column (frames: "
               "PatchDataset; volumes: SliceDataset, or the Store API while SliceDataset is not in the build) is "
               "this row's. Below 1× means the row is faster.")
    out.append("* **Memory**: peak USS (psutil: pages only that process maps, including file pages of a memory map "
               "touched by that process alone) and, in brackets, peak anonymous memory (heap, caches, copies; from "
               "/proc/PID/smaps_rollup), sampled after the timed repeats while the same stream goes on. "
               "'per worker' is the largest DataLoader worker; 'in process' is the measuring process during the "
               "in-process run.")
    out.append("")

    # ---------------------------------------------------------------- references
    mc = res.get("memcpy", {})
    out.append("## Physical references (same run)")
    out.append("")
    out.append("| reference | figure | as samples/s |")
    out.append("|---|---:|---:|")
    win_b = 5 * cfg.get("patch", 256) ** 2 * 4
    if "gb_per_s" in mc:
        out.append(f"| single-thread memcpy (numpy copyto of 256 MiB; bytes copied per second) | "
                   f"{_f(mc['gb_per_s'])} GB/s | {_f(mc['bytes_per_s'] / win_b)} frame windows/s |")
    else:
        out.append(f"| single-thread memcpy | failed: {mc.get('error', '?')} | |")
    for sec, key, variant, label in ((frames, "ram_crop", "", "in-RAM crop copy of the frames' windows (Python loop)"),
                                     (vols, "ram_slices", "2d", "in-RAM slice copy, 2D"),
                                     (vols, "ram_slices", "2.5d", "in-RAM stack copy, 2.5D")):
        m = _find(sec, key)
        r = _run(m, f"{variant}|inproc" if variant else "inproc") if m else None
        if r:
            out.append(f"| {label} | {_f(r['mb_per_s'] / 1000)} GB/s | {_f(r['samples_per_s'])} |")
    m = _find(frames, "null")
    for mode, lab in (("dl2", "DataLoader, 2 workers"), ("inproc", "in process")):
        r = _run(m, mode) if m else None
        if r:
            out.append(f"| null Dataset (preallocated 1.31 MB tensor, no I/O), {lab}, batch 16 | "
                       f"{_f(r['mb_per_s'] / 1000)} GB/s | {_f(r['samples_per_s'])} |")
    out.append("")

    # ---------------------------------------------------------------- frames
    if frames.get("methods"):
        out.append("## Frames (the seed's 1920×1080 rgb/mask/depth windows)")
        out.append("")
        rows = [("seed_original", "", "seed's original Dataset (skimage decode per item)"),
                ("seed_recommended", "cold", "seed's recommended (cv2 + per-worker cache), cold first pass"),
                ("seed_recommended", "warm", "seed's recommended (cv2 + per-worker cache), warm"),
                ("npy_memmap", "", "float32 .npy per frame via numpy.memmap + crop"),
                ("lmdb", "", "LMDB (py-lmdb) raw float32 + numpy.frombuffer"),
                ("ffcv", "", "FFCV (NDArrayField full frames, RANDOM, os_cache)"),
                ("monai", "", "MONAI PersistentDataset + RandCropByPosNegLabeld"),
                ("torchio", "", "TorchIO Queue + LabelSampler"),
                ("webdataset", "", "WebDataset (tar shards of float32 .npy)"),
                ("hf_datasets", "", "Hugging Face datasets (Arrow, memory-mapped)"),
                ("patchstore_patchdataset", "", "patchstore PatchDataset"),
                ("patchstore_batchloader", "1 thread", "patchstore BatchLoader, num_threads=1"),
                ("patchstore_batchloader", "2 threads", "patchstore BatchLoader, num_threads=2"),
                ("null", "", "null Dataset (no I/O)"),
                ("ram_crop", "", "reference: in-RAM crop copy")]
        lines, notes = _table(frames, rows, "patchstore_patchdataset", "")
        out += lines
        out.append("")
        out.append("<details><summary>What each frames row does</summary>")
        out.append("")
        out += notes
        out.append("")
        out.append("</details>")
        out.append("")

    # ---------------------------------------------------------------- volumes
    if vols.get("methods"):
        sd = _find(vols, "patchstore_slicedataset")
        ps_key = "patchstore_slicedataset" if sd and _rate(sd, "2d|inproc") else "patchstore_store"
        rows = [("h5_hws_gzip", "{v}", "h5py, (H,W,S) gzip (the seed's file)"),
                ("h5_shw_chunk", "{v}", "h5py, (S,H,W), (1,H,W) chunks, uncompressed"),
                ("zarr", "{v}", "zarr, (1,H,W) chunks, no compressor"),
                ("tensorstore", "{v}", "TensorStore (zarr3 driver)"),
                ("monai_slices", "{v}", "MONAI 2D-slice recipe (GridPatchDataset)"),
                ("npy_memmap", "{v}", "numpy.memmap of (S,H,W) float32"),
                ("lmdb", "{v}", "LMDB, one record per slice"),
                ("patchstore_store", "{v}", "patchstore Store.get() view + copy"),
                ("patchstore_slicedataset", "{v}", "patchstore SliceDataset"),
                ("ram_slices", "{v}", "reference: in-RAM copy")]
        for variant, title in (("2d", "2D slices"), ("2.5d", "2.5D: 5 neighbouring slices per item")):
            out.append(f"## Volumes, {title}")
            out.append("")
            lines, notes = _table(vols, [(k, v.format(v=variant), lab) for k, v, lab in rows], ps_key, variant)
            out += lines
            out.append("")
            if variant == "2d":
                out.append("<details><summary>What each volumes row does</summary>")
                out.append("")
                out += notes
                out.append("")
                out.append("</details>")
                out.append("")

    # ---------------------------------------------------------------- ingest
    out.append("## Conversion / ingest: seconds and bytes on disk")
    out.append("")
    out.append("Each format is built from the source files by the harness (frames: decoded with OpenCV + OpenEXR; "
               "volumes: read from the seed's HDF5 file), page cache warm, no fsync.")
    out.append("")
    out.append("| workload | format | seconds | MB on disk | × float32 payload | how |")
    out.append("|---|---|---:|---:|---:|---|")
    fpay = n_frames * 5 * cfg.get("width", 0) * cfg.get("height", 0) * 4 if n_frames else None
    vpay = vo_gen.get("voxels", 0) * 3 * 4 or None
    out += _ingest_rows("frames", frames, fpay)
    out += _ingest_rows("volumes", vols, vpay)
    if fpay:
        out.append(f"| | float32 payload | | frames {_f(fpay / 1e6)}" + (f", volumes {_f(vpay / 1e6)}" if vpay else "")
                   + " | 1 | |")
    out.append("")

    # ---------------------------------------------------------------- goals
    out.append("## Goals, as measured in this run")
    out.append("")
    mc_bps = (res.get("memcpy") or {}).get("bytes_per_s")
    fr_bytes = 5 * cfg.get("patch", 256) ** 2 * 4
    vol_bytes = {"2d": 3 * cfg.get("vol_hw", 256) ** 2 * 4, "2.5d": 15 * cfg.get("vol_hw", 256) ** 2 * 4}

    def ceil(other: Optional[float], nbytes: float) -> Optional[float]:
        return mc_bps / nbytes / other if mc_bps and other else None

    out.append("The last but one column is the ratio a loader would reach if it delivered samples at this "
               "machine's single-thread memcpy speed (every loader here copies each output byte at least once), "
               "against the same comparison figure: where it is below the goal, no copying loader can meet the "
               "goal on this machine with one thread.")
    out.append("")
    out.append("| goal | measured | | memcpy ceiling | how |")
    out.append("|---|---:|---|---:|---|")
    pd = _find(frames, "patchstore_patchdataset")
    so = _find(frames, "seed_original")
    nm = _find(frames, "npy_memmap")
    for mode, lab in (("inproc", "in process"), ("dl2", "DataLoader, 2 workers")):
        a, b = _rate(pd, mode), _rate(so, mode)
        out.append(_goal(f"frames: patchstore ≥ 1000× the seed's original ({lab})", a / b if a and b else None,
                         1000, f"PatchDataset {_f(a)} vs {_f(b)} samples/s", ceil(b, fr_bytes)))
    for mode, lab in (("inproc", "in process"), ("dl2", "DataLoader, 2 workers")):
        a, b = _rate(pd, mode), _rate(nm, mode)
        out.append(_goal(f"frames: patchstore ≥ 5× numpy.memmap + crop in a Python loop ({lab})",
                         a / b if a and b else None, 5, f"PatchDataset {_f(a)} vs {_f(b)} samples/s",
                         ceil(b, fr_bytes)))
    ps_v = _find(vols, ps_key) if vols.get("methods") else None
    ps_name = "SliceDataset" if ps_key == "patchstore_slicedataset" else "Store.get()"
    for other, need, lab in (("h5_shw_chunk", 5, "h5py on the (S,H,W) layout"), ("npy_memmap", 1.0, "numpy.memmap")):
        om = _find(vols, other) if vols.get("methods") else None
        for variant in ("2d", "2.5d"):
            for mode, mlab in (("inproc", "in process"), ("dl2", "DataLoader")):
                a, b = _rate(ps_v, f"{variant}|{mode}"), _rate(om, f"{variant}|{mode}")
                out.append(_goal(f"volumes: patchstore ≥ {need:g}× {lab} ({variant.upper()}, {mlab})",
                                 a / b if a and b else None, need,
                                 f"patchstore {ps_name} {_f(a)} vs {_f(b)} samples/s",
                                 ceil(b, vol_bytes[variant])))
    bl = _find(frames, "patchstore_batchloader")
    best_bl = max([x for x in (_rate(bl, "1 thread|inproc"), _rate(bl, "2 threads|inproc")) if x], default=None)
    peers = [(m["key"], _rate(m, "dl2") or _rate(m, "warm|dl2")) for m in frames.get("methods", [])
             if not m.get("is_patchstore") and m.get("key") not in PEER_EXCLUDE]
    peers = [(k, r) for k, r in peers if r]
    best_peer = max(peers, key=lambda kr: kr[1]) if peers else None
    if bl is not None and "unavailable" in bl:
        out.append(f"| frames: BatchLoader in the training process ≥ 10× the best DataLoader figure of any peer | "
                   f"not measured | — | — | {bl['unavailable']} |")
    else:
        out.append(_goal("frames: BatchLoader in the training process ≥ 10× the best DataLoader figure of any peer",
                         best_bl / best_peer[1] if best_bl and best_peer else None, 10,
                         f"BatchLoader {_f(best_bl)} vs {best_peer[0] if best_peer else '—'} "
                         f"{_f(best_peer[1] if best_peer else None)} samples/s (DataLoader, 2 workers)",
                         ceil(best_peer[1] if best_peer else None, fr_bytes)))
    out.append("")

    # ---------------------------------------------------------------- failures
    fails = []
    for wl, sec in (("frames", frames), ("volumes", vols)):
        for m in sec.get("methods", []):
            if "unavailable" in m:
                fails.append(f"* {wl} / {m['label']}: {m['unavailable']}.")
            elif "error" in m:
                fails.append(f"* {wl} / {m['label']}: `{m['error']}`.")
            for name, r in m.get("runs", {}).items():
                if "error" in r:
                    fails.append(f"* {wl} / {m['label']} [{name}]: `{r['error']}`.")
    out.append("## Peers or runs that did not work")
    out.append("")
    if fails:
        out += fails
    else:
        out.append("* none: every peer installed and ran.")
    ffcv = res.get("ffcv_install")
    if ffcv:
        out.append(f"* FFCV install (bench/compare/run.sh): {ffcv}")
    skv = res.get("versions", {}).get("scikit-image", "not installed")
    if skv != "not installed":
        out.append(f"* scikit-image {skv} is installed, so the seed's original Dataset uses skimage.io.imread itself "
                   f"(no pillow emulation); EXR depth is read with the OpenEXR package in every Python Dataset.")
    else:
        out.append("* scikit-image is not installed: the seed's original Dataset is emulated with pillow "
                   "(PIL.Image.open) for the PNGs.")
    out.append("")

    # ---------------------------------------------------------------- noise
    out.append("## Noise, honestly")
    out.append("")
    spreads = [r["spread"] for sec in (frames, vols) for m in sec.get("methods", [])
               for r in m.get("runs", {}).values() if r.get("spread") is not None]
    if spreads:
        med = statistics.median(spreads)
        big = sum(1 for s in spreads if s > 0.25)
        out.append(f"* Over all {len(spreads)} timed runs the spread between repeats has a median of {med:.0%}; "
                   f"{big} runs spread by more than 25%. Treat differences under ~1.5× as noise; the ratios of "
                   f"10× and more are not.")
    if loads:
        out.append(f"* This machine is shared: the 1-minute load average ranged {_f(min(loads))}–{_f(max(loads))} "
                   f"on {mach.get('cores')} cores during the measurements, so other processes competed for the "
                   f"CPU (DataLoader runs use 3 processes on 2 cores even without them). Each method ran in its "
                   f"own fresh process, one after the other, not interleaved, so slow drifts in load affect "
                   f"different rows differently.")
    fc = [(wl, m["label"], name, r["foreign_cores"]) for wl, sec in (("frames", frames), ("volumes", vols))
          for m in sec.get("methods", []) for name, r in m.get("runs", {}).items()
          if r.get("foreign_cores") is not None]
    if fc:
        busy = [x for x in fc if x[3] > 0.3]
        out.append(f"* Other processes took {_f(min(x[3] for x in fc))}–{_f(max(x[3] for x in fc))} cores during the "
                   f"timed repeats; {len(busy)} of {len(fc)} runs had more than 0.3 cores taken from them"
                   + (": " + "; ".join(f"{wl} {lab} [{nm}] {v:.1f}" for wl, lab, nm, v in busy[:12])
                      + (" …" if len(busy) > 12 else "") if busy else "") + ".")
    out.append("* All data sat in the page cache (the formats together fit in RAM): this measures CPU, memory "
               "and IPC cost, not disk. A store larger than RAM reads at disk speed whatever the format.")
    out.append("* With DataLoader workers every batch crosses a process boundary through shared memory; on 2 cores "
               "that costs more than the decode-free formats save, which is why several decode-free rows are "
               "slower with 2 workers than in process (see the null Dataset row for the ceiling).")
    out.append("* Windows: rows marked with their own sampler (MONAI, TorchIO, BatchLoader) or their own order "
               "(WebDataset, FFCV, MONAI's grid) read different windows or slices than the shared sequence; "
               "the cost per window is the same kind, the exact bytes are not.")
    if res.get("retried"):
        out.append(f"* Re-measured once at the end because other processes took more than "
                   f"{cfg.get('retry_above_cores')} cores during their first run (the table keeps, per run, the "
                   f"measurement with less foreign load; both are in results.json): "
                   f"{', '.join(res['retried'])}.")
    if quick:
        out.append("* Quick mode: small data and short repeats; use the default run for figures to quote.")
    out.append("")

    # ---------------------------------------------------------------- versions
    out.append("## Package versions")
    out.append("")
    out.append("| package | version |")
    out.append("|---|---|")
    for k, v in res.get("versions", {}).items():
        out.append(f"| {k} | {v} |")
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(render(json.load(f)))
