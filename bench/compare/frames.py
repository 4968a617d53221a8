"""Frames workload: the seed's 1920x1080 video frames (rgb PNG, mask PNG, depth EXR).

An *item* is one frame with k=4 windows of 256x256 that each hold at least
one mask pixel; it returns {"rgb": (k,3,P,P), "mask": (k,1,P,P), "depth":
(k,1,P,P)} float32 (rgb as x/255*2-1, mask {0,1}, depth as stored). A
*sample* (the unit of every figure) is one window with its three fields:
5 x 256 x 256 float32 = 1.31 MB. A batch is 4 items = 16 windows.

The random sequence: epoch e visits the frames in a random permutation;
frame f's k windows in epoch e are patchstore.torch.PatchDataset's
positions(f, e) (uniform over the corners whose window holds a mask pixel,
a function of (seed, epoch, frame)), checked against the decoded mask. Every
method that can address a frame and a window reads exactly these; methods
whose library picks the windows itself (MONAI, TorchIO) or the order
(WebDataset shard order, FFCV's RANDOM order) say so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from common import ROOT, Config, SeqSampler, du, flatten_collate, forever, shutdown_loader

FIELDS = ("rgb", "mask", "depth")
CH = {"rgb": 3, "mask": 1, "depth": 1}
TEMPLATES = {
    "rgb": "{video}/render/rgb/{frame}.png",
    "mask": "{video}/render/masks/{frame}.png",
    "depth": "{video}/render/depth/{frame}.exr",
}


# --------------------------------------------------------------------------- context


class Ctx:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.root = os.path.join(cfg.work, "frames")
        self.src = os.path.join(self.root, "src")
        self.fmt = os.path.join(self.root, "fmt")
        self.P, self.k = cfg.patch, cfg.k
        self.H, self.W = cfg.height, cfg.width
        self.bytes_per_sample = 5 * self.P * self.P * 4
        self._seq: Optional[Dict[str, np.ndarray]] = None
        self._ids: Optional[List[str]] = None

    @property
    def ids(self) -> List[str]:
        """Frame ids "videoVV/FFFF" in patchstore's index order (= sorted)."""
        if self._ids is None:
            ids = []
            for v in sorted(os.listdir(self.src)):
                d = os.path.join(self.src, v, "render", "rgb")
                for f in sorted(os.listdir(d)):
                    ids.append(f"{v}/{os.path.splitext(f)[0]}")
            self._ids = ids
        return self._ids

    @property
    def N(self) -> int:
        return len(self.ids)

    def paths(self, f: int) -> Dict[str, str]:
        video, frame = self.ids[f].split("/")
        return {name: os.path.join(self.src, t.format(video=video, frame=frame)) for name, t in TEMPLATES.items()}

    def store_path(self) -> str:
        return os.path.join(self.fmt, "patchstore", "frames.ps")

    @property
    def seq(self) -> Dict[str, np.ndarray]:
        if self._seq is None:
            z = np.load(os.path.join(self.root, "seq.npz"))
            self._seq = {k: z[k] for k in z.files}
        return self._seq

    @property
    def L(self) -> int:
        return int(self.seq["frame"].shape[0])


# --------------------------------------------------------------------------- data


def read_exr(path: str) -> np.ndarray:
    import OpenEXR

    with OpenEXR.File(path) as f:
        ch = f.channels()
        name = "Z" if "Z" in ch else sorted(ch)[0]
        return np.ascontiguousarray(ch[name].pixels, dtype=np.float32)


def decode_frame(paths: Dict[str, str]) -> Dict[str, np.ndarray]:
    """The reference decode (OpenCV + OpenEXR, patchstore's normalisation): {field: (C,H,W) float32}."""
    import cv2

    bgr = cv2.imread(paths["rgb"], cv2.IMREAD_COLOR)
    rgb = np.ascontiguousarray(np.moveaxis(bgr[:, :, ::-1], -1, 0)).astype(np.float32) / 255 * 2 - 1
    m = cv2.imread(paths["mask"], cv2.IMREAD_UNCHANGED)
    if m.ndim == 3:
        m = m.max(axis=2)
    mask = (m != 0).astype(np.float32)[None]
    depth = read_exr(paths["depth"])[None]
    return {"rgb": rgb, "mask": mask, "depth": depth}


def generate(cfg: Config) -> Dict[str, Any]:
    """The seed's layout with tools/make_frames.py (deterministic)."""
    ctx = Ctx(cfg)
    done = os.path.join(ctx.root, "src.done")
    if os.path.exists(done):
        return {"note": "reused"}
    shutil.rmtree(ctx.src, ignore_errors=True)
    os.makedirs(ctx.root, exist_ok=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_frames.py"), ctx.src,
                    "--videos", str(cfg.videos), "--frames", str(cfg.frames_per_video),
                    "--height", str(cfg.height), "--width", str(cfg.width), "--seed", str(cfg.seed)], check=True)
    secs = time.perf_counter() - t
    open(done, "w").close()
    return {"seconds": secs, "bytes": du(ctx.src), "frames": Ctx(cfg).N}


def make_sequence(cfg: Config) -> Dict[str, Any]:
    """The shared random sequence (see the module docstring); needs the patchstore store."""
    ctx = Ctx(cfg)
    N = ctx.N
    E = max(2, -(-cfg.seq_items // N))
    rng = np.random.default_rng(cfg.seed + 1)
    order = np.concatenate([rng.permutation(N) for _ in range(E)]).astype(np.int64)
    epoch = np.repeat(np.arange(E, dtype=np.int64), N)
    win = np.zeros((E, N, cfg.k, 2), np.int64)
    source = "patchstore.torch.PatchDataset.positions(frame, epoch)"
    try:
        from patchstore.torch import PatchDataset

        ds = PatchDataset(ctx.store_path(), FIELDS, cfg.patch, patches_per_sample=cfg.k, require="mask", seed=0)
        for e in range(E):
            for f in range(N):
                s, ys, xs = ds.positions(f, e)
                if s != f:
                    raise RuntimeError(f"PatchDataset maps frame {f} to sample {s}")
                win[e, f, :, 0], win[e, f, :, 1] = ys, xs
    except Exception as exc:  # noqa: BLE001 - fall back to our own uniform draw
        source = f"own uniform draw over valid corners (PatchDataset unavailable: {exc})"
        for f in range(N):
            ok = _valid_corners(decode_frame(ctx.paths(f))["mask"][0], cfg.patch)
            flat = np.flatnonzero(ok)
            t = flat[rng.integers(0, flat.size, size=(E, cfg.k))]
            win[:, f, :, 0], win[:, f, :, 1] = t // ok.shape[1], t % ok.shape[1]
    # Independent check: every window lies inside the frame and holds a mask pixel.
    bad = 0
    for f in range(N):
        ok = _valid_corners(decode_frame(ctx.paths(f))["mask"][0], cfg.patch)
        ys, xs = win[:, f, :, 0].ravel(), win[:, f, :, 1].ravel()
        inside = (ys >= 0) & (xs >= 0) & (ys < ok.shape[0]) & (xs < ok.shape[1])
        bad += int((~inside).sum()) + int((~ok[ys[inside], xs[inside]]).sum())
    np.savez(os.path.join(ctx.root, "seq.npz"), frame=order, epoch=epoch, win=win)
    return {"items": int(order.size), "epochs": E, "windows_source": source,
            "windows_checked": int(E * N * cfg.k), "windows_without_mask_pixel": bad}


def _valid_corners(mask: np.ndarray, P: int) -> np.ndarray:
    """ok[y, x]: the PxP window at (y, x) holds a non-zero mask pixel (integral image)."""
    H, W = mask.shape
    ii = np.zeros((H + 1, W + 1), np.int64)
    ii[1:, 1:] = (mask != 0).cumsum(0).cumsum(1)
    ny, nx = H - P + 1, W - P + 1
    return (ii[P:P + ny, P:P + nx] - ii[:ny, P:P + nx] - ii[P:P + ny, :nx] + ii[:ny, :nx]) > 0


# --------------------------------------------------------------------------- methods: base


def _count(b: Dict[str, Any]) -> int:
    return int(b["rgb"].shape[0])


class _SeqDataset:
    """Map-style dataset over the shared sequence: index j -> (frame, its k windows)."""

    def __init__(self, ctx: Ctx) -> None:
        import torch  # noqa: F401

        s = ctx.seq
        self.frame, self.epoch, self.win = s["frame"], s["epoch"], s["win"]
        self.L = int(self.frame.shape[0])
        self.P, self.k = ctx.P, ctx.k

    def __len__(self) -> int:
        return self.L

    def where(self, j: int) -> Tuple[int, np.ndarray]:
        j %= self.L
        f = int(self.frame[j])
        return f, self.win[int(self.epoch[j]), f]

    def __getitem__(self, j: int) -> Dict[str, Any]:
        f, yx = self.where(j)
        return self.cut(f, yx)

    def cut(self, f: int, yx: np.ndarray) -> Dict[str, Any]:
        raise NotImplementedError

    def crop_chw(self, arrays: Dict[str, np.ndarray], yx: np.ndarray) -> Dict[str, Any]:
        """k windows of (C,H,W) arrays into fresh (k,C,P,P) tensors (one copy)."""
        import torch

        P = self.P
        out = {}
        for name, a in arrays.items():
            t = np.empty((len(yx), a.shape[0], P, P), np.float32)
            for i, (y, x) in enumerate(yx):
                t[i] = a[:, y:y + P, x:x + P]
            out[name] = torch.from_numpy(t)
        return out


class Method:
    key = ""
    label = ""
    fmt: Optional[str] = None
    modes: Tuple[str, ...] = ("inproc", "dl2")
    variants: Tuple[str, ...] = ("",)
    windows = "the shared sequence"
    note = ""
    is_patchstore = False

    def prepare(self, ctx: Ctx) -> Optional[Dict[str, Any]]:
        return None

    def dataset(self, ctx: Ctx) -> Any:
        raise NotImplementedError

    collate = staticmethod(flatten_collate)

    def warmup(self, ctx: Ctx, mode: str, variant: str) -> int:
        return ctx.cfg.warmup_batches if mode == "inproc" else max(ctx.cfg.warmup_batches, 2 * ctx.cfg.workers + 1)

    def stream(self, ctx: Ctx, mode: str,
               variant: str) -> Tuple[Iterator[Any], Callable[[Any], int], Callable[[], None]]:
        from torch.utils.data import DataLoader

        ds = self.dataset(ctx)
        nw = 0 if mode == "inproc" else ctx.cfg.workers
        dl = DataLoader(ds, batch_size=ctx.cfg.items_per_batch, sampler=SeqSampler(ds.L), num_workers=nw,
                        collate_fn=self.collate, prefetch_factor=2 if nw else None)
        it = iter(dl)
        return it, _count, lambda: shutdown_loader(it)

    def check(self, ctx: Ctx) -> str:
        """Compares the first batch's windows with the reference decode."""
        ds = self.dataset(ctx)
        n = ctx.cfg.items_per_batch
        items = ds.__getitems__(list(range(n))) if hasattr(ds, "__getitems__") else [ds[j] for j in range(n)]
        return compare_items(ctx, items, ds)


def compare_items(ctx: Ctx, items: List[Dict[str, Any]], ds: Any) -> str:
    ref_cache: Dict[int, Dict[str, np.ndarray]] = {}
    worst = 0.0
    P = ctx.P
    for j, item in enumerate(items):
        f, yx = _SeqDataset.where(ds if isinstance(ds, _SeqDataset) else _Where(ctx), j)
        if f not in ref_cache:
            ref_cache[f] = decode_frame(ctx.paths(f))
        ref = ref_cache[f]
        for name in FIELDS:
            got = np.asarray(item[name]).reshape(len(yx), CH[name], P, P)
            for i, (y, x) in enumerate(yx):
                d = float(np.abs(got[i] - ref[name][:, y:y + P, x:x + P]).max())
                worst = max(worst, d)
    if worst == 0:
        return "identical to the reference decode"
    return f"max |difference| to the reference decode: {worst:.3g}"


class _Where:
    def __init__(self, ctx: Ctx) -> None:
        s = ctx.seq
        self.frame, self.epoch, self.win, self.L = s["frame"], s["epoch"], s["win"], int(s["frame"].shape[0])


def check_own_windows(batch_masks: Any, k_total: int) -> str:
    m = np.asarray(batch_masks).reshape(k_total, -1)
    held = int((m.max(axis=1) > 0).sum())
    return f"own windows (not the shared sequence); {held}/{k_total} of the first batch hold a mask pixel"


# --------------------------------------------------------------------------- the seed's Datasets


class SeedOriginalDS(_SeqDataset):
    """The seed's original: skimage.io.imread rgb + mask, OpenEXR depth, decoded per item."""

    def cut(self, f: int, yx: np.ndarray) -> Dict[str, Any]:
        import torch

        try:
            from skimage.io import imread
        except ImportError:  # pillow emulation (the report says which one ran)
            from PIL import Image

            def imread(path: str) -> np.ndarray:
                return np.asarray(Image.open(path))

        p = self.paths[f]
        image = imread(p["rgb"])
        mask = imread(p["mask"])
        depth = read_exr(p["depth"])
        P = self.P
        rgb = np.empty((len(yx), 3, P, P), np.float32)
        m = np.empty((len(yx), 1, P, P), np.float32)
        d = np.empty((len(yx), 1, P, P), np.float32)
        for i, (y, x) in enumerate(yx):
            rgb[i] = np.moveaxis(image[y:y + P, x:x + P, :3], [0, 1, 2], [1, 2, 0]).astype(np.float32) / 255 * 2 - 1
            m[i, 0] = mask[y:y + P, x:x + P].astype(np.float32) / 255
            d[i, 0] = depth[y:y + P, x:x + P]
        return {"rgb": torch.from_numpy(rgb), "mask": torch.from_numpy(m), "depth": torch.from_numpy(d)}


class SeedOriginal(Method):
    key = "seed_original"
    label = "seed's original Dataset (skimage.io.imread + OpenEXR per item)"
    note = "decodes the 3 files of a frame for every item; k=4 windows per decode (the seed's multi-patch idea)"

    def dataset(self, ctx: Ctx) -> Any:
        ds = _torchify(SeedOriginalDS)(ctx)
        ds.paths = [ctx.paths(f) for f in range(ctx.N)]
        return ds


class SeedCachedDS(_SeqDataset):
    """The seed's recommended Dataset: cv2.imread + a per-process dict cache of float32 full frames."""

    def __init__(self, ctx: Ctx, misses: Any) -> None:
        super().__init__(ctx)
        self.paths = [ctx.paths(f) for f in range(ctx.N)]
        self.cache: Dict[str, np.ndarray] = {}
        self.misses = misses

    def _get(self, path: str, kind: str) -> np.ndarray:
        a = self.cache.get(path)
        if a is None:
            import cv2

            self.misses.value += 1
            if kind == "rgb":
                a = cv2.imread(path)[:, :, ::-1].astype(np.float32) / 255 * 2 - 1
            elif kind == "mask":
                a = cv2.imread(path, cv2.IMREAD_UNCHANGED).astype(np.float32) / 255
            else:
                a = read_exr(path)
            self.cache[path] = a
        return a

    def cut(self, f: int, yx: np.ndarray) -> Dict[str, Any]:
        import torch

        p = self.paths[f]
        image, mask, depth = self._get(p["rgb"], "rgb"), self._get(p["mask"], "mask"), self._get(p["depth"], "depth")
        P = self.P
        rgb = np.empty((len(yx), 3, P, P), np.float32)
        m = np.empty((len(yx), 1, P, P), np.float32)
        d = np.empty((len(yx), 1, P, P), np.float32)
        for i, (y, x) in enumerate(yx):
            rgb[i] = np.moveaxis(image[y:y + P, x:x + P, :3], [0, 1, 2], [1, 2, 0])
            m[i, 0] = mask[y:y + P, x:x + P]
            d[i, 0] = depth[y:y + P, x:x + P]
        return {"rgb": torch.from_numpy(rgb), "mask": torch.from_numpy(m), "depth": torch.from_numpy(d)}


class SeedRecommended(Method):
    key = "seed_recommended"
    label = "seed's recommended Dataset (cv2.imread + per-worker cache)"
    variants = ("cold", "warm")
    note = ("the answer's code: cv2 for PNG, OpenEXR for EXR (pyexr wraps it), float32 full frames cached in a dict "
            "per process; cold = first pass over all frames with fresh workers (worker start included), warm = "
            "after every worker has cached every frame")

    def __init__(self) -> None:
        self._misses: Any = None

    def dataset(self, ctx: Ctx) -> Any:
        import multiprocessing

        self._misses = multiprocessing.RawValue("q", 0)
        return _torchify(SeedCachedDS)(ctx, self._misses)

    def warmup(self, ctx: Ctx, mode: str, variant: str) -> int:
        epoch_batches = -(-ctx.N // ctx.cfg.items_per_batch)
        # in a DataLoader each worker sees about half the frames per epoch: 8 epochs leave
        # a given (frame, worker) pair uncached with probability 1/256
        return epoch_batches + 1 if mode == "inproc" else 8 * epoch_batches

    def misses(self) -> int:
        return int(self._misses.value) if self._misses is not None else -1


# --------------------------------------------------------------------------- decode-once formats


def _prepare_each_frame(ctx: Ctx, name: str, write: Callable[[int, Dict[str, np.ndarray]], None],
                        finish: Optional[Callable[[], None]] = None, out: Optional[str] = None) -> Dict[str, Any]:
    out = out or os.path.join(ctx.fmt, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    t = time.perf_counter()
    for f in range(ctx.N):
        write(f, decode_frame(ctx.paths(f)))
    if finish is not None:
        finish()
    return {"seconds": time.perf_counter() - t, "bytes": du(out), "path": out}


class NpyDS(_SeqDataset):
    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.dir = os.path.join(ctx.fmt, "npy")
        self.maps: Dict[Tuple[int, str], np.ndarray] = {}

    def cut(self, f: int, yx: np.ndarray) -> Dict[str, Any]:
        arrays = {}
        for name in FIELDS:
            a = self.maps.get((f, name))
            if a is None:
                a = self.maps[(f, name)] = np.load(os.path.join(self.dir, f"{f:05d}_{name}.npy"), mmap_mode="r")
            arrays[name] = a
        return self.crop_chw(arrays, yx)


class NpyMemmap(Method):
    key = "npy_memmap"
    label = "numpy.memmap of float32 .npy per frame + crop in a Python loop"
    fmt = "npy"
    note = "np.load(mmap_mode='r') once per file and process; each window copied with a slice assignment"

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        d = os.path.join(ctx.fmt, "npy")

        def write(f: int, a: Dict[str, np.ndarray]) -> None:
            for name in FIELDS:
                np.save(os.path.join(d, f"{f:05d}_{name}.npy"), a[name])

        return _prepare_each_frame(ctx, "npy", write)

    def dataset(self, ctx: Ctx) -> Any:
        return _torchify(NpyDS)(ctx)


class LmdbDS(_SeqDataset):
    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.dir = os.path.join(ctx.fmt, "lmdb")
        self.shape = {name: (CH[name], ctx.H, ctx.W) for name in FIELDS}
        self.env: Any = None
        self.pid = -1

    def __getstate__(self) -> Dict[str, Any]:
        d = self.__dict__.copy()
        d["env"], d["pid"] = None, -1
        return d

    def cut(self, f: int, yx: np.ndarray) -> Dict[str, Any]:
        import lmdb

        if self.env is None or self.pid != os.getpid():
            self.env = lmdb.open(self.dir, readonly=True, lock=False, readahead=False, meminit=False, max_readers=64)
            self.pid = os.getpid()
        with self.env.begin(buffers=True) as txn:  # buffers=True: memoryviews into the map, no copy
            arrays = {name: np.frombuffer(txn.get(f"{f}/{name}".encode()), np.float32).reshape(self.shape[name])
                      for name in FIELDS}
            return self.crop_chw(arrays, yx)


class Lmdb(Method):
    key = "lmdb"
    label = "LMDB (py-lmdb), raw float32 records + numpy.frombuffer"
    fmt = "lmdb"
    note = "one record per frame and field; txn.get with buffers=True (zero-copy), then a crop copy per window"

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import lmdb

        d = os.path.join(ctx.fmt, "lmdb")
        size = ctx.N * 5 * ctx.H * ctx.W * 4
        state: Dict[str, Any] = {}

        def write(f: int, a: Dict[str, np.ndarray]) -> None:
            if "env" not in state:
                state["env"] = lmdb.open(d, map_size=int(size * 1.5) + (64 << 20), sync=False, metasync=False)
            with state["env"].begin(write=True) as txn:
                for name in FIELDS:
                    txn.put(f"{f}/{name}".encode(), a[name].tobytes())

        def finish() -> None:
            state["env"].sync(True)
            state["env"].close()

        return _prepare_each_frame(ctx, "lmdb", write, finish)

    def dataset(self, ctx: Ctx) -> Any:
        return _torchify(LmdbDS)(ctx)


class HfDS(_SeqDataset):
    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.dir = os.path.join(ctx.fmt, "hf")
        self.ds: Any = None
        self.pid = -1

    def __getstate__(self) -> Dict[str, Any]:
        d = self.__dict__.copy()
        d["ds"], d["pid"] = None, -1
        return d

    def cut(self, f: int, yx: np.ndarray) -> Dict[str, Any]:
        if self.ds is None or self.pid != os.getpid():
            import datasets

            self.ds = datasets.load_from_disk(self.dir).with_format("numpy")
            self.pid = os.getpid()
        row = self.ds[f]
        return self.crop_chw({name: row[name] for name in FIELDS}, yx)


class HfDatasets(Method):
    key = "hf_datasets"
    label = "Hugging Face datasets (Arrow, memory-mapped, Array3D float32)"
    fmt = "hf"
    note = "load_from_disk(...).with_format('numpy'); ds[frame] materialises the row's three arrays, then crops"

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import datasets

        datasets.disable_progress_bars()
        H, W = ctx.H, ctx.W
        feats = datasets.Features({name: datasets.Array3D((CH[name], H, W), "float32") for name in FIELDS})
        out = os.path.join(ctx.fmt, "hf")
        tmp = os.path.join(ctx.fmt, "hf-build-cache")
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        paths = [ctx.paths(f) for f in range(ctx.N)]

        def gen():
            for p in paths:
                yield decode_frame(p)

        t = time.perf_counter()
        ds = datasets.Dataset.from_generator(gen, features=feats, cache_dir=tmp, writer_batch_size=1)
        ds.save_to_disk(out)
        secs = time.perf_counter() - t
        del ds
        shutil.rmtree(tmp, ignore_errors=True)
        return {"seconds": secs, "bytes": du(out), "path": out,
                "note": "Dataset.from_generator (Arrow cache) + save_to_disk; the time includes both writes"}

    def dataset(self, ctx: Ctx) -> Any:
        return _torchify(HfDS)(ctx)


# --------------------------------------------------------------------------- streaming formats


class WebDatasetMethod(Method):
    key = "webdataset"
    label = "WebDataset (tar shards of float32 .npy)"
    fmt = "wds"
    windows = "the sequence's windows, in shard order"
    note = ("frames stored decoded (float32 .npy in the tar, the decode-once equivalent); streamed in shard order "
            "(no random access; no shuffle buffer); a frame's n-th visit uses the sequence's n-th epoch windows; "
            "with workers, shards are split between workers")

    def shards(self, ctx: Ctx) -> List[str]:
        d = os.path.join(ctx.fmt, "wds")
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tar"))

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import io

        import webdataset as wds

        d = os.path.join(ctx.fmt, "wds")
        nshards = 4
        per = -(-ctx.N // nshards)
        state: Dict[str, Any] = {}

        def write(f: int, a: Dict[str, np.ndarray]) -> None:
            s = f // per
            if state.get("shard") != s:
                if "w" in state:
                    state["w"].close()
                state["w"] = wds.TarWriter(os.path.join(d, f"frames-{s:04d}.tar"))
                state["shard"] = s
            sample = {"__key__": f"{f:06d}", "idx.cls": f}
            for name in FIELDS:
                buf = io.BytesIO()
                np.save(buf, a[name])
                sample[f"{name}.npy"] = buf.getvalue()
            state["w"].write(sample)

        def finish() -> None:
            state["w"].close()

        return _prepare_each_frame(ctx, "wds", write, finish)

    def stream(self, ctx: Ctx, mode: str, variant: str):
        import torch
        import webdataset as wds
        from torch.utils.data import DataLoader

        s = ctx.seq
        win, E, P = s["win"], s["win"].shape[0], ctx.P
        visits: Dict[int, int] = {}

        def cut(sample: Dict[str, Any]) -> Dict[str, Any]:
            f = int(sample["idx.cls"])
            e = visits.get(f, 0)
            visits[f] = e + 1
            yx = win[e % E, f]
            out = {}
            for name in FIELDS:
                a = sample[f"{name}.npy"]
                t = np.empty((len(yx), a.shape[0], P, P), np.float32)
                for i, (y, x) in enumerate(yx):
                    t[i] = a[:, y:y + P, x:x + P]
                out[name] = torch.from_numpy(t)
            return out

        ds = wds.WebDataset(self.shards(ctx), shardshuffle=False, empty_check=False).decode().map(cut).repeat()
        nw = 0 if mode == "inproc" else ctx.cfg.workers
        dl = DataLoader(ds, batch_size=ctx.cfg.items_per_batch, num_workers=nw, collate_fn=flatten_collate,
                        prefetch_factor=2 if nw else None)
        it = iter(dl)
        return it, _count, lambda: shutdown_loader(it)

    def check(self, ctx: Ctx) -> str:
        it, _, close = self.stream(ctx, "inproc", "")
        b = next(it)
        close()
        # shard order: frames 0, 1, 2, 3 with their first-visit (epoch 0) windows
        s = ctx.seq
        worst = 0.0
        P = ctx.P
        for j in range(ctx.cfg.items_per_batch):
            ref = decode_frame(ctx.paths(j))
            for i, (y, x) in enumerate(s["win"][0, j]):
                for name in FIELDS:
                    got = b[name][j * ctx.k + i].numpy()
                    worst = max(worst, float(np.abs(got - ref[name][:, y:y + P, x:x + P]).max()))
        return "identical to the reference decode" if worst == 0 else f"max |difference|: {worst:.3g}"


class Ffcv(Method):
    key = "ffcv"
    label = "FFCV (full frames as NDArrayField, OrderOption.RANDOM, os_cache=True)"
    fmt = "ffcv"
    windows = "the sequence's windows, FFCV's order"
    note = ("FFCV's own Loader (threads, not processes: 'in process' = 1 thread, 'DataLoader' column = "
            "num_workers=2 threads); it hands over whole (4,5,H,W) frame batches, the 16 windows are cut in the "
            "training process; a frame's n-th visit uses the sequence's n-th epoch windows")

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        from ffcv.fields import IntField, NDArrayField
        from ffcv.writer import DatasetWriter

        d = os.path.join(ctx.fmt, "ffcv")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        paths = [ctx.paths(f) for f in range(ctx.N)]

        class Src:
            def __len__(self) -> int:
                return len(paths)

            def __getitem__(self, f: int):
                a = decode_frame(paths[f])
                return (np.concatenate([a["rgb"], a["mask"], a["depth"]]), f)

        t = time.perf_counter()
        w = DatasetWriter(os.path.join(d, "frames.beton"),
                          {"frame": NDArrayField(np.dtype("float32"), (5, ctx.H, ctx.W)), "idx": IntField()},
                          num_workers=1, page_size=1 << 26)
        w.from_indexed_dataset(Src())
        return {"seconds": time.perf_counter() - t, "bytes": du(d), "path": d,
                "note": "DatasetWriter(num_workers=1, page_size=64 MiB)"}

    def stream(self, ctx: Ctx, mode: str, variant: str):
        import torch
        from ffcv.fields.decoders import IntDecoder, NDArrayDecoder
        from ffcv.loader import Loader, OrderOption

        s = ctx.seq
        win, E, P, k = s["win"], s["win"].shape[0], ctx.P, ctx.k
        visits: Dict[int, int] = {}
        nw = 1 if mode == "inproc" else ctx.cfg.workers
        loader = Loader(os.path.join(ctx.fmt, "ffcv", "frames.beton"), batch_size=ctx.cfg.items_per_batch,
                        num_workers=nw, order=OrderOption.RANDOM, os_cache=True, seed=ctx.cfg.seed,
                        pipelines={"frame": [NDArrayDecoder()], "idx": [IntDecoder()]})

        def gen():
            for frames, idx in forever(lambda: loader):
                B = frames.shape[0]
                out = {name: np.empty((B * k, CH[name], P, P), np.float32) for name in FIELDS}
                for b in range(B):
                    f = int(idx[b].reshape(-1)[0])
                    e = visits.get(f, 0)
                    visits[f] = e + 1
                    for i, (y, x) in enumerate(win[e % E, f]):
                        w = frames[b, :, y:y + P, x:x + P]
                        out["rgb"][b * k + i] = w[0:3]
                        out["mask"][b * k + i] = w[3:4]
                        out["depth"][b * k + i] = w[4:5]
                yield {name: torch.from_numpy(v) for name, v in out.items()}

        return gen(), _count, lambda: None

    def check(self, ctx: Ctx) -> str:
        return "windows cut from FFCV's decoded frames (values checked only for shape)"


# --------------------------------------------------------------------------- medical-imaging frameworks


class Monai(Method):
    key = "monai"
    label = "MONAI PersistentDataset + RandCropByPosNegLabeld(num_samples=4)"
    fmt = "monai"
    windows = "MONAI's own (pos=1, neg=0: centred on mask pixels)"
    note = ("deterministic part (decode to float32 CHW) cached by PersistentDataset as .pt files; "
            "RandCropByPosNegLabeld(pos=1, neg=0, num_samples=4) per item (foreground indices computed per item); "
            "list_data_collate; frames in the sequence's order")

    def _transform(self, ctx: Ctx):
        from monai.transforms import Compose, MapTransform, RandCropByPosNegLabeld

        class LoadFramed(MapTransform):
            def __init__(self) -> None:
                super().__init__(keys=list(FIELDS))

            def __call__(self, data):
                return dict(decode_frame({k: data[k] for k in FIELDS}))

        return Compose([LoadFramed(),
                        RandCropByPosNegLabeld(keys=list(FIELDS), label_key="mask", spatial_size=(ctx.P, ctx.P),
                                               pos=1, neg=0, num_samples=ctx.k)])

    def _data(self, ctx: Ctx, frames: Any) -> List[Dict[str, str]]:
        paths = [ctx.paths(f) for f in range(ctx.N)]
        return [dict(paths[int(f)]) for f in frames]

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        from monai.data import PersistentDataset

        d = os.path.join(ctx.fmt, "monai")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        t = time.perf_counter()
        ds = PersistentDataset(self._data(ctx, range(ctx.N)), transform=self._transform(ctx), cache_dir=d)
        for f in range(ctx.N):
            ds[f]
        return {"seconds": time.perf_counter() - t, "bytes": du(d), "path": d,
                "note": "first pass through PersistentDataset (writes the .pt cache)"}

    def dataset(self, ctx: Ctx) -> Any:
        from monai.data import PersistentDataset

        ds = PersistentDataset(self._data(ctx, ctx.seq["frame"]), transform=self._transform(ctx),
                               cache_dir=os.path.join(ctx.fmt, "monai"))
        ds.L = len(ds)
        return ds

    @staticmethod
    def collate(batch):
        from monai.data import list_data_collate

        return list_data_collate(batch)

    def check(self, ctx: Ctx) -> str:
        ds = self.dataset(ctx)
        b = self.collate([ds[j] for j in range(ctx.cfg.items_per_batch)])
        return check_own_windows(b["mask"], ctx.cfg.items_per_batch * ctx.k)


class TorchIO(Method):
    key = "torchio"
    label = "TorchIO Queue + LabelSampler (samples_per_volume=4)"
    fmt = "nifti"
    windows = "TorchIO's own (LabelSampler on the mask)"
    note = ("frames converted to uncompressed NIfTI (rgb 4D, mask LabelMap, depth); Queue(max_length=16, "
            "samples_per_volume=4, LabelSampler((256,256,1), 'mask')); the outer DataLoader has num_workers=0 as "
            "TorchIO requires, the 'DataLoader' column is Queue(num_workers=2); subjects in TorchIO's shuffled order")

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import nibabel as nib

        d = os.path.join(ctx.fmt, "nifti")

        def write(f: int, a: Dict[str, np.ndarray]) -> None:
            for name in FIELDS:
                x = a[name]  # (C,H,W) -> NIfTI (H,W,1[,C])
                arr = np.moveaxis(x, 0, -1)[:, :, None, :] if x.shape[0] > 1 else x[0][:, :, None]
                nib.save(nib.Nifti1Image(np.ascontiguousarray(arr), np.eye(4)),
                         os.path.join(d, f"{f:05d}_{name}.nii"))

        return _prepare_each_frame(ctx, "nifti", write)

    def _queue(self, ctx: Ctx, nw: int):
        import torchio as tio

        d = os.path.join(ctx.fmt, "nifti")
        subjects = [tio.Subject(rgb=tio.ScalarImage(os.path.join(d, f"{f:05d}_rgb.nii")),
                                mask=tio.LabelMap(os.path.join(d, f"{f:05d}_mask.nii")),
                                depth=tio.ScalarImage(os.path.join(d, f"{f:05d}_depth.nii")))
                    for f in range(ctx.N)]
        sampler = tio.LabelSampler(patch_size=(ctx.P, ctx.P, 1), label_name="mask")
        return tio.Queue(tio.SubjectsDataset(subjects), max_length=16, samples_per_volume=ctx.k, sampler=sampler,
                         num_workers=nw, shuffle_subjects=True, shuffle_patches=True)

    def stream(self, ctx: Ctx, mode: str, variant: str):
        from torch.utils.data import DataLoader

        q = self._queue(ctx, 0 if mode == "inproc" else ctx.cfg.workers)
        dl = DataLoader(q, batch_size=ctx.cfg.items_per_batch * ctx.k, num_workers=0)
        return forever(lambda: dl), lambda b: int(b["rgb"]["data"].shape[0]), lambda: None

    def warmup(self, ctx: Ctx, mode: str, variant: str) -> int:
        return 2

    def check(self, ctx: Ctx) -> str:
        it, _, _ = self.stream(ctx, "inproc", "")
        b = next(it)
        n = int(b["mask"]["data"].shape[0])
        shape = tuple(b["rgb"]["data"].shape)
        return check_own_windows(b["mask"]["data"], n) + f"; rgb batch {shape}"


# --------------------------------------------------------------------------- patchstore


class _PSSeqDS:
    """PatchDataset driven by the shared sequence: a batch of indices j -> set_epoch(e) + __getitems__(frames)."""

    def __init__(self, ctx: Ctx) -> None:
        from patchstore.torch import PatchDataset

        s = ctx.seq
        self.frame, self.epoch = s["frame"], s["epoch"]
        self.L = int(self.frame.shape[0])
        self.ds = PatchDataset(ctx.store_path(), FIELDS, ctx.P, patches_per_sample=ctx.k, require="mask", seed=0)

    def __len__(self) -> int:
        return self.L

    def __getitems__(self, js: List[int]) -> List[Dict[str, Any]]:
        js = [j % self.L for j in js]
        out: List[Dict[str, Any]] = []
        run: List[int] = []
        e = int(self.epoch[js[0]])
        for j in js + [None]:  # type: ignore[list-item]
            if j is None or int(self.epoch[j]) != e:
                if self.ds.epoch != e:
                    self.ds.set_epoch(e)
                out.extend(self.ds.__getitems__([int(self.frame[i]) for i in run]))
                if j is None:
                    break
                run, e = [], int(self.epoch[j])
            run.append(j)
        return out

    def __getitem__(self, j: int) -> Dict[str, Any]:
        return self.__getitems__([j])[0]


class PatchStoreDataset(Method):
    key = "patchstore_patchdataset"
    label = "patchstore.torch.PatchDataset (require='mask', k=4) + patchstore.torch.collate"
    fmt = "patchstore"
    is_patchstore = True
    note = ("batches of 4 items fetched through __getitems__ (one C++ gather per field); with DataLoader workers the "
            "epoch is a shared value, so at an epoch boundary a batch may use the neighbouring epoch's windows "
            "(same cost)")

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import patchstore

        store = ctx.store_path()
        shutil.rmtree(os.path.dirname(store), ignore_errors=True)
        os.makedirs(os.path.dirname(store))
        t = time.perf_counter()
        s = patchstore.ingest_images(store, root=ctx.src, fields=TEMPLATES, durable=False)
        return {"seconds": time.perf_counter() - t, "bytes": du(store), "path": store,
                "note": f"patchstore.ingest_images(..., durable=False) on all cores; {s.samples_written} frames"}

    def dataset(self, ctx: Ctx) -> Any:
        return _torchify(_PSSeqDS)(ctx)

    @staticmethod
    def collate(batch):
        from patchstore.torch import collate

        return collate(batch)


class PatchStoreBatchLoader(Method):
    key = "patchstore_batchloader"
    label = "patchstore.torch.BatchLoader (batches of 16 windows gathered in C++)"
    fmt = "patchstore"
    is_patchstore = True
    variants = ("1 thread", "2 threads")
    windows = "BatchLoader's own (patchstore.PatchSampler, require='mask')"
    note = ("BatchLoader(store, fields, 256, batch_size=16, patches_per_sample=4, require='mask', num_threads=T): "
            "'in process' = iterated in the training process; 'DataLoader' = DataLoader(loader, batch_size=None, "
            "num_workers=2) as its docstring describes")

    def available(self) -> Optional[str]:
        try:
            import patchstore
            import patchstore.torch as pt
        except Exception as e:  # noqa: BLE001
            return f"patchstore not importable: {e}"
        if not hasattr(pt, "BatchLoader"):
            extra = "" if hasattr(patchstore, "PatchSampler") else " (nor patchstore.PatchSampler)"
            return "not available in this build: patchstore.torch has no BatchLoader" + extra
        return None

    def _make(self, ctx: Ctx, threads: int):
        import inspect

        import patchstore.torch as pt

        BL = pt.BatchLoader
        B = ctx.cfg.items_per_batch * ctx.k
        attempts = [
            lambda: BL(ctx.store_path(), list(FIELDS), ctx.P, batch_size=B, patches_per_sample=ctx.k,
                       require="mask", num_threads=threads),
            lambda: BL(ctx.store_path(), list(FIELDS), ctx.P, B, patches_per_sample=ctx.k, require="mask"),
        ]
        errors = []
        for a in attempts:
            try:
                return a()
            except TypeError as e:
                errors.append(str(e))
        raise TypeError(f"could not construct BatchLoader{inspect.signature(BL)}: {'; '.join(errors)}")

    def stream(self, ctx: Ctx, mode: str, variant: str):
        bl = self._make(ctx, 2 if variant.startswith("2") else 1)

        def count(b: Any) -> int:
            if isinstance(b, dict):
                return int(b["rgb"].shape[0])
            return int(b[0].shape[0])

        if mode == "inproc":
            return forever(lambda: bl), count, lambda: getattr(bl, "close", lambda: None)()
        from torch.utils.data import DataLoader

        dl = DataLoader(bl, batch_size=None, num_workers=ctx.cfg.workers, persistent_workers=True)
        return forever(lambda: dl), count, lambda: None

    def check(self, ctx: Ctx) -> str:
        it, count, close = self.stream(ctx, "inproc", "1 thread")
        b = next(it)
        n = count(b)
        msg = check_own_windows(b["mask"], n) if isinstance(b, dict) and "mask" in b else type(b).__name__
        close()
        return msg + f"; batch of {n} windows"


# --------------------------------------------------------------------------- references


class NullDS:
    def __init__(self, ctx: Ctx) -> None:
        import torch

        self.t = torch.zeros((5, ctx.P, ctx.P), dtype=torch.float32)
        self.L = 1 << 30

    def __len__(self) -> int:
        return self.L

    def __getitem__(self, j: int) -> Any:
        return self.t


class Null(Method):
    key = "null"
    label = "null Dataset (returns a preallocated 5x256x256 float32 tensor = 1.31 MB, no I/O)"
    windows = "none (no I/O)"
    note = "default_collate of 16 samples: the DataLoader's own ceiling for 1.31 MB samples"

    def dataset(self, ctx: Ctx) -> Any:
        return _torchify(NullDS)(ctx)

    def stream(self, ctx: Ctx, mode: str, variant: str):
        from torch.utils.data import DataLoader

        nw = 0 if mode == "inproc" else ctx.cfg.workers
        dl = DataLoader(self.dataset(ctx), batch_size=ctx.cfg.items_per_batch * ctx.k, sampler=SeqSampler(1 << 30),
                        num_workers=nw, prefetch_factor=2 if nw else None)
        it = iter(dl)
        return it, lambda b: int(b.shape[0]), lambda: shutdown_loader(it)

    def check(self, ctx: Ctx) -> str:
        return "n/a"


class RamCrop(Method):
    key = "ram_crop"
    label = "reference: in-RAM crop copy (float32 frames in a Python list, np.copyto into a batch)"
    modes = ("inproc",)
    note = "all frames decoded in RAM beforehand; the sequence's windows copied into a preallocated (16,C,P,P) batch"

    def stream(self, ctx: Ctx, mode: str, variant: str):
        frames = [decode_frame(ctx.paths(f)) for f in range(ctx.N)]
        s = ctx.seq
        order, epoch, win = s["frame"], s["epoch"], s["win"]
        L, P, k, B = int(order.shape[0]), ctx.P, ctx.k, ctx.cfg.items_per_batch
        out = {name: np.empty((B * k, CH[name], P, P), np.float32) for name in FIELDS}

        def gen():
            j = 0
            while True:
                for b in range(B):
                    f = int(order[j % L])
                    fr = frames[f]
                    for i, (y, x) in enumerate(win[int(epoch[j % L]), f]):
                        for name in FIELDS:
                            np.copyto(out[name][b * k + i], fr[name][:, y:y + P, x:x + P])
                    j += 1
                yield out

        return gen(), _count, lambda: None

    def check(self, ctx: Ctx) -> str:
        return "reference"


# --------------------------------------------------------------------------- registry


_TORCHIFIED: Dict[type, type] = {}


def _torchify(cls: type) -> type:
    """cls with torch.utils.data.Dataset as an extra base (so torch is imported only where needed)."""
    if cls not in _TORCHIFIED:
        from torch.utils.data import Dataset

        t = type(cls.__name__ + "_T", (cls, Dataset), {"__module__": __name__})
        _TORCHIFIED[cls] = t
        globals()[t.__name__] = t
    return _TORCHIFIED[cls]


METHODS: List[Method] = [
    SeedOriginal(), SeedRecommended(), NpyMemmap(), Lmdb(), Ffcv(), Monai(), TorchIO(), WebDatasetMethod(),
    HfDatasets(), PatchStoreDataset(), PatchStoreBatchLoader(), Null(), RamCrop(),
]


def __getattr__(name: str) -> Any:
    """Lets pickle (spawn/forkserver workers) find the torch Dataset classes made by _torchify."""
    if name.endswith("_T") and name[:-2] in globals():
        return _torchify(globals()[name[:-2]])
    raise AttributeError(name)


def method(key: str) -> Method:
    for m in METHODS:
        if m.key == key:
            return m
    raise KeyError(key)
