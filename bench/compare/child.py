"""One stage of the benchmark in its own process (started by run.py).

    python child.py STAGE WORKLOAD KEY CONFIG.json OUT.json

STAGE: gen (write the source data), seq (the shared random sequence),
prep (convert/ingest one format), run (prepare if needed, check, measure one
method in every mode and variant), memcpy (the physical reference).
Each method runs in a fresh process so that imports, caches, threads and
memory of one peer do not leak into the next one's figures.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Config, fmt_error, log, measure_passes, measure_stream, write_json  # noqa: E402


def _module(workload: str):
    if workload == "frames":
        import frames as m
    else:
        import volumes as m
    return m


def prepare(mod: Any, ctx: Any, m: Any) -> Dict[str, Any]:
    """Converts the source into m's format once (cached in fmt/<fmt>.json)."""
    if not m.fmt:
        return {}
    stats_path = os.path.join(ctx.fmt, m.fmt + ".json")
    if os.path.exists(stats_path):
        with open(stats_path) as f:
            st = json.load(f)
        st["reused"] = True
        return st
    os.makedirs(ctx.fmt, exist_ok=True)
    st = m.prepare(ctx)
    if st is None:  # shares another method's format, which is already there
        return {}
    st = {k: v for k, v in st.items() if k != "path"}
    write_json(stats_path, st)
    return st


def run_method(workload: str, key: str, cfg: Config) -> Dict[str, Any]:
    mod = _module(workload)
    ctx = mod.Ctx(cfg)
    m = mod.method(key)
    res: Dict[str, Any] = {"key": key, "label": m.label, "note": m.note, "fmt": m.fmt,
                           "is_patchstore": m.is_patchstore, "runs": {}}
    res["order"] = getattr(m, "windows", None) or getattr(m, "order", None)
    avail = getattr(m, "available", None)
    if avail is not None:
        why = avail()
        if why:
            res["unavailable"] = why
            return res
    try:
        import torch

        # One intra-op thread in the measuring process, as torch gives each DataLoader worker:
        # with the default (one per core) torch.stack in default_collate spin-waits in OpenMP
        # whenever the other core is busy, and in-process figures swing by 10x on this machine.
        res["torch_threads_default"] = torch.get_num_threads()
        torch.set_num_threads(1)
        res["torch_threads"] = torch.get_num_threads()
    except Exception:  # noqa: BLE001
        pass
    try:
        res["prepare"] = prepare(mod, ctx, m)
    except BaseException as e:  # noqa: BLE001
        res["error"] = "conversion failed: " + fmt_error(e)
        log(traceback.format_exc())
        return res
    try:
        res["check"] = m.check(ctx)
    except BaseException as e:  # noqa: BLE001
        res["check"] = "check failed: " + fmt_error(e)
        log(traceback.format_exc())
    for variant in m.variants:
        for mode in m.modes:
            name = f"{variant}|{mode}" if variant else mode
            log(f"[{workload}/{key}] {name} ...")
            t0 = time.perf_counter()
            try:
                if workload == "frames":
                    bps = ctx.bytes_per_sample
                else:
                    bps = ctx.bytes_per_sample(variant)
                if variant == "cold":
                    r = _cold(mod, ctx, m, mode, bps)
                else:
                    it, count, close = m.stream(ctx, mode, variant)
                    warm = m.warmup(ctx, mode, variant)
                    if cfg.quick and mode != "inproc" and not hasattr(m, "misses"):
                        warm = min(warm, max(2 * cfg.workers, 2))
                    r = measure_stream(it, count, cfg, warmup_batches=warm,
                                       bytes_per_sample=bps, close=close,
                                       # with workers, batches arrive in bursts of up to
                                       # workers: time at least two rounds
                                       min_batches_per_repeat=2 if mode == "inproc" else 2 * cfg.workers)
                    del it, count, close
                if hasattr(m, "misses"):
                    r["cache_misses_total"] = m.misses()
            except BaseException as e:  # noqa: BLE001
                if isinstance(e, KeyboardInterrupt):
                    raise
                r = {"error": fmt_error(e)}
                log(traceback.format_exc())
            r["wall_s"] = round(time.perf_counter() - t0, 2)
            res["runs"][name] = r
            log(f"[{workload}/{key}] {name}: " + (f"{r['samples_per_s']:.1f} samples/s" if "samples_per_s" in r
                                                  else r.get("error", "")))
            gc.collect()
    return res


def _cold(mod: Any, ctx: Any, m: Any, mode: str, bps: float) -> Dict[str, Any]:
    """First pass over every frame with a fresh Dataset (and fresh workers): the seed's cold cache."""
    from torch.utils.data import DataLoader

    nw = 0 if mode == "inproc" else ctx.cfg.workers

    def one_pass() -> int:
        ds = m.dataset(ctx)
        dl = DataLoader(ds, batch_size=ctx.cfg.items_per_batch, sampler=list(range(ctx.N)), num_workers=nw,
                        collate_fn=m.collate)
        n = 0
        for b in dl:
            n += int(b["rgb"].shape[0])
        del dl, ds
        gc.collect()
        return n

    return measure_passes(one_pass, ctx.cfg, 3, bps)


def memcpy(cfg: Config) -> Dict[str, Any]:
    """Single-thread memcpy bandwidth: numpy copy of 256 MiB (read 256 MiB + write 256 MiB per copy)."""
    import statistics

    import numpy as np

    n = 64 << 20  # float32 elements = 256 MiB
    a = np.ones(n, np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    rates = []
    for _ in range(max(5, cfg.repeats)):
        t = time.perf_counter()
        np.copyto(b, a)
        rates.append(a.nbytes / (time.perf_counter() - t))
    med = statistics.median(rates)
    return {"bytes_per_s": med, "gb_per_s": med / 1e9, "repeats_gb_per_s": [round(r / 1e9, 2) for r in rates],
            "spread": (max(rates) - min(rates)) / med, "bytes_per_copy": int(a.nbytes),
            "loadavg": os.getloadavg()[0]}


def main() -> int:
    stage, workload, key, cfg_path, out = sys.argv[1:6]
    cfg = Config.load(cfg_path)
    t0 = time.perf_counter()
    try:
        if stage == "gen":
            r = _module(workload).generate(cfg)
        elif stage == "seq":
            r = _module(workload).make_sequence(cfg)
        elif stage == "prep":
            mod = _module(workload)
            r = prepare(mod, mod.Ctx(cfg), mod.method(key))
        elif stage == "run":
            r = run_method(workload, key, cfg)
        elif stage == "memcpy":
            r = memcpy(cfg)
        else:
            raise SystemExit(f"unknown stage {stage}")
    except BaseException as e:  # noqa: BLE001
        log(traceback.format_exc())
        r = {"error": fmt_error(e)}
    r["stage_s"] = round(time.perf_counter() - t0, 2)
    write_json(out, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
