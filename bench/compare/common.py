"""Shared pieces of the side-by-side benchmark: timing, memory, machine facts.

Every method is measured the same way (see `measure_stream`):

  * a stream of batches (a DataLoader, or a library's own loader) is started;
  * `warmup_batches` batches are read and thrown away (worker start-up,
    imports, JIT, first decode, page faults);
  * a probe of ~`probe_s` seconds estimates the time per batch, which fixes
    how many batches one repeat reads (about `target_s` seconds' worth);
  * `repeats` repeats are timed; each gives samples/s; the median is
    reported together with the spread (max-min)/median.

After the timed repeats the stream goes on for about one more repeat while
a thread samples every process involved (the measuring process and its
children, i.e. DataLoader workers) every `poll_s` seconds and keeps, per
process, the peak USS (psutil's memory_full_info().uss: the
pages only that process maps) and the peak anonymous memory (from
/proc/PID/smaps_rollup: heap, caches, copies; file pages excluded).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

MB = 1e6  # output figures are in MB = 10^6 bytes


# --------------------------------------------------------------------------- config


@dataclass
class Config:
    work: str
    quick: bool = False
    # frames
    videos: int = 4
    frames_per_video: int = 6
    height: int = 1080
    width: int = 1920
    patch: int = 256
    k: int = 4
    items_per_batch: int = 4  # frames: 4 items x k=4 windows = 16 windows per batch
    # volumes
    patients: int = 12
    vol_hw: int = 256
    slices_min: int = 80
    slices_max: int = 112
    context: int = 2  # 2.5D: 2*context+1 = 5 neighbouring slices
    vol_batch: int = 16
    # timing
    repeats: int = 5
    target_s: float = 0.5
    probe_s: float = 0.25
    warmup_batches: int = 3
    seq_items: int = 6000  # length of the random sequence (wraps around)
    workers: int = 2
    poll_s: float = 0.2
    max_run_s: float = 25.0  # slow methods: fewer repeats (never under 3) to stay within this
    max_warmup_s: float = 0.0  # >0: end the warm-up after this long (once 2 batches per worker arrived)
    retry_budget_s: float = 240.0  # re-measure rows that shared the CPU, within this many seconds
    retry_above_cores: float = 0.3
    child_timeout_s: int = 420
    seed: int = 0

    @staticmethod
    def load(path: str) -> "Config":
        with open(path) as f:
            return Config(**json.load(f))

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.__dict__, f, indent=1)


# --------------------------------------------------------------------------- memory


def _rollup(pid: int) -> Dict[str, int]:
    out: Dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    out[parts[0][:-1]] = int(parts[1]) * 1024
    except OSError:
        pass
    return out


class MemoryMonitor:
    """Samples USS (psutil) and anonymous memory of this process and its descendants."""

    def __init__(self, poll_s: float = 0.2) -> None:
        import psutil

        self._psutil = psutil
        self.poll_s = poll_s
        self.me = os.getpid()
        self.peak_uss: Dict[int, int] = {}
        self.peak_anon: Dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def sample(self) -> None:
        psutil = self._psutil
        try:
            procs = [psutil.Process(self.me)] + psutil.Process(self.me).children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                uss = p.memory_full_info().uss
            except psutil.Error:
                continue
            anon = _rollup(p.pid).get("Anonymous", 0)
            if uss > self.peak_uss.get(p.pid, 0):
                self.peak_uss[p.pid] = uss
            if anon > self.peak_anon.get(p.pid, 0):
                self.peak_anon[p.pid] = anon

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.sample()

    def __enter__(self) -> "MemoryMonitor":
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> Dict[str, Any]:
        workers = [pid for pid in self.peak_uss if pid != self.me]
        return {
            "main_uss_mb": round(self.peak_uss.get(self.me, 0) / MB, 1),
            "main_anon_mb": round(self.peak_anon.get(self.me, 0) / MB, 1),
            "worker_uss_mb": round(max((self.peak_uss[p] for p in workers), default=0) / MB, 1),
            "worker_anon_mb": round(max((self.peak_anon.get(p, 0) for p in workers), default=0) / MB, 1),
            "workers_seen": len(workers),
        }


# --------------------------------------------------------------------------- timing


def cpu_snapshot() -> Tuple[float, float, float]:
    """(wall clock, CPU seconds used by the whole machine, CPU seconds used by this process and its children)."""
    import psutil

    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = (sum(v) - v[3] - v[4]) / tick  # everything but idle and iowait (steal included)
    own = 0.0
    try:
        me = psutil.Process()
        for p in [me] + me.children(recursive=True):
            try:
                t = p.cpu_times()
                own += t.user + t.system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return time.perf_counter(), busy, own


def foreign_cores(a: Tuple[float, float, float], b: Tuple[float, float, float]) -> float:
    """Cores' worth of CPU that other processes (or the hypervisor: steal) took between two snapshots."""
    wall = max(b[0] - a[0], 1e-9)
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / wall)


def measure_stream(
    batches: Iterator[Any],
    count: Callable[[Any], int],
    cfg: Config,
    *,
    warmup_batches: Optional[int] = None,
    bytes_per_sample: float,
    close: Optional[Callable[[], None]] = None,
    max_batches_per_repeat: int = 100000,
    min_batches_per_repeat: int = 2,
) -> Dict[str, Any]:
    """Times `batches` as described in the module docstring; returns the figures and memory peaks.

    Memory is sampled only after the timed repeats, while the same stream
    goes on for about one more repeat: reading /proc/PID/smaps_rollup walks
    the page tables of the process under its mmap lock, which would slow the
    very allocations and page faults being timed.
    """
    warm = cfg.warmup_batches if warmup_batches is None else warmup_batches
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    for i in range(warm):
        count(next(batches))
        if cfg.max_warmup_s > 0 and i + 1 >= min(warm, 2 * cfg.workers) and \
                time.perf_counter() - t0 > cfg.max_warmup_s:
            warm = i + 1
            break
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    nb = 0
    while True:
        count(next(batches))
        nb += 1
        if time.perf_counter() - t0 >= cfg.probe_s or nb >= max_batches_per_repeat:
            break
    per_batch = (time.perf_counter() - t0) / nb
    per_repeat = int(max(min_batches_per_repeat,
                         min(max_batches_per_repeat, round(cfg.target_s / max(per_batch, 1e-9)))))
    repeats = max(3, min(cfg.repeats, int(cfg.max_run_s // max(per_repeat * per_batch, 1e-9))))
    cpu0 = cpu_snapshot()
    rates: List[float] = []
    samples_per_repeat = 0
    for _ in range(repeats):
        s = 0
        t0 = time.perf_counter()
        for _ in range(per_repeat):
            s += count(next(batches))
        dt = time.perf_counter() - t0
        rates.append(s / dt)
        samples_per_repeat = s
    cpu1 = cpu_snapshot()
    load1 = os.getloadavg()[0]
    mon = MemoryMonitor(cfg.poll_s)
    with mon:
        t0 = time.perf_counter()
        n = 0
        while n < 1 or time.perf_counter() - t0 < 4 * cfg.poll_s:
            count(next(batches))
            n += 1
        mon.sample()
    if close is not None:
        close()
    med = statistics.median(rates)
    out = {
        "samples_per_s": med,
        "mb_per_s": med * bytes_per_sample / MB,
        "repeats": [round(r, 2) for r in rates],
        "spread": (max(rates) - min(rates)) / med if med > 0 else None,
        "batches_per_repeat": per_repeat,
        "samples_per_repeat": samples_per_repeat,
        "warmup_batches": warm,
        "warmup_s": round(warmup_s, 3),
        "loadavg": [round(load0, 2), round(load1, 2)],
        "foreign_cores": round(foreign_cores(cpu0, cpu1), 2),
    }
    out.update(mon.summary())
    return out


def measure_passes(run_pass: Callable[[], int], cfg: Config, repeats: int, bytes_per_sample: float) -> Dict[str, Any]:
    """Times `repeats` calls of run_pass() (each returns its sample count), then one more under the memory monitor."""
    load0 = os.getloadavg()[0]
    rates: List[float] = []
    n = 0
    cpu0 = cpu_snapshot()
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = run_pass()
        rates.append(n / (time.perf_counter() - t0))
    cpu1 = cpu_snapshot()
    load1 = os.getloadavg()[0]
    with MemoryMonitor(cfg.poll_s) as mon:
        run_pass()
    med = statistics.median(rates)
    out = {
        "samples_per_s": med,
        "mb_per_s": med * bytes_per_sample / MB,
        "repeats": [round(r, 2) for r in rates],
        "spread": (max(rates) - min(rates)) / med if med > 0 else None,
        "samples_per_repeat": n,
        "loadavg": [round(load0, 2), round(load1, 2)],
        "foreign_cores": round(foreign_cores(cpu0, cpu1), 2),
    }
    out.update(mon.summary())
    return out


# --------------------------------------------------------------------------- torch helpers


class SeqSampler:
    """Yields start, start+1, ... (mod length) for ever: indices into the shared random sequence.

    A plain iterable (torch's DataLoader accepts any iterable as sampler), so
    one DataLoader iteration streams over many epochs without the start-up
    bubble a new epoch costs.
    """

    def __init__(self, length: int, start: int = 0) -> None:
        self.length, self.start = int(length), int(start)

    def __iter__(self) -> Iterator[int]:
        j = self.start
        while True:
            yield j % self.length
            j += 1


def flatten_collate(batch: List[Dict[str, Any]]) -> Dict[str, Any]:
    """default_collate (shared memory in workers), then (B, k, C, P, P) -> (B*k, C, P, P).

    The collate of the seed (torch.cat)."""
    from torch.utils.data import default_collate

    out = default_collate(batch)
    for key, v in out.items():
        if hasattr(v, "dim") and v.dim() == 5:
            out[key] = v.view(-1, *v.shape[2:])
    return out


def forever(make_iter: Callable[[], Any]) -> Iterator[Any]:
    """Restarts an epoch-bound loader at the end of each epoch (TorchIO Queue, FFCV, MONAI grid)."""
    while True:
        empty = True
        for b in make_iter():
            empty = False
            yield b
        if empty:
            raise RuntimeError("loader yielded no batch")


def shutdown_loader(it: Any) -> None:
    """Stops DataLoader workers of an iterator now (instead of at garbage collection)."""
    fn = getattr(it, "_shutdown_workers", None)
    if fn is not None:
        try:
            fn()
        except Exception:
            pass


# --------------------------------------------------------------------------- facts


def du(path: str) -> int:
    """Bytes allocated on disk under path (st_blocks; sparse files count what they use)."""
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except OSError:
                pass
    return total


def machine_info() -> Dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    caches = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("L2 cache", "L3 cache"):
                caches[k.strip()] = v.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import psutil

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "caches": caches,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "os": platform.platform(),
    }


PACKAGES = [
    "numpy", "torch", "patchstore", "scikit-image", "opencv-python-headless", "OpenEXR", "pillow", "lmdb",
    "ffcv", "numba", "monai", "torchio", "SimpleITK", "nibabel", "webdataset", "datasets", "pyarrow", "h5py",
    "zarr", "numcodecs", "tensorstore", "psutil", "scipy",
]


def package_versions() -> Dict[str, str]:
    from importlib import metadata

    out = {}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    if out.get("patchstore") == "not installed":
        try:
            import patchstore

            out["patchstore"] = f"{patchstore.__version__} (build tree)"
        except Exception as e:  # noqa: BLE001
            out["patchstore"] = f"not importable: {e}"
    try:
        import h5py

        out["libhdf5"] = h5py.version.hdf5_version
    except Exception:  # noqa: BLE001
        pass
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        out["patchstore commit"] = rev + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def fmt_error(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}"
    s = " ".join(s.split())
    return s[:400]


def write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=_json_default)
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def log(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)
