"""Volumes workload: the seed's MR->CT data, 2D slices (and 2.5D stacks) out of 3D volumes.

The harness writes the seed's file: one HDF5 file with groups MR, CT and
MASK, one float32 dataset per patient of shape (H, W, S), gzip-compressed
with h5py's automatic chunks (what `create_dataset(..., compression="gzip")`
gives). Every other format is converted from it.

An *item* (= a *sample*, the unit of every figure) is one slice of MR, CT and
MASK: {"MR": (1,H,W), "CT": (1,H,W), "MASK": (1,H,W)} float32 (786 KB for
256x256). The 2.5D case returns the 5 neighbouring slices s-2..s+2 of each
field: (5,H,W) each (3.9 MB); its centres are drawn from [2, S-3] so that no
method needs padding. A batch is 16 items.

The random sequence: uniform random (patient, slice) pairs, the same for
every method that can address a slice; MONAI's 2D-slice recipe
(GridPatchDataset) iterates each volume's slices in order instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from common import ROOT, Config, SeqSampler, du, fmt_error, forever, shutdown_loader

GROUPS = ("MR", "CT", "MASK")


class Ctx:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.root = os.path.join(cfg.work, "volumes")
        self.src = os.path.join(self.root, "src", "synthrad.h5")
        self.fmt = os.path.join(self.root, "fmt")
        self.H = self.W = cfg.vol_hw
        self._seq: Optional[Dict[str, np.ndarray]] = None

    @property
    def seq(self) -> Dict[str, np.ndarray]:
        if self._seq is None:
            z = np.load(os.path.join(self.root, "seq.npz"))
            self._seq = {k: z[k] for k in z.files}
        return self._seq

    @property
    def patients(self) -> List[str]:
        return [str(x) for x in self.seq["patients"]]

    def store_path(self) -> str:
        return os.path.join(self.fmt, "patchstore", "volumes.ps")

    def context(self, variant: str) -> int:
        return self.cfg.context if variant == "2.5d" else 0

    def bytes_per_sample(self, variant: str) -> int:
        return 3 * (2 * self.context(variant) + 1) * self.H * self.W * 4


# --------------------------------------------------------------------------- data


def _volume(rng: np.random.Generator, H: int, W: int, S: int) -> Dict[str, np.ndarray]:
    """A body-like ellipse with structures; MR noisy, CT in HU-like steps scaled to [-1, 1], MASK {0, 1}."""
    yy, xx, ss = np.meshgrid(np.linspace(-1, 1, H, dtype=np.float32), np.linspace(-1, 1, W, dtype=np.float32),
                             np.linspace(-1, 1, S, dtype=np.float32), indexing="ij")
    a, b = rng.uniform(0.6, 0.9), rng.uniform(0.5, 0.8)
    body = ((yy / a) ** 2 + (xx / b) ** 2 + 0.3 * ss ** 2) < 1
    organ = ((yy - rng.uniform(-0.3, 0.3)) ** 2 + (xx - rng.uniform(-0.3, 0.3)) ** 2) < rng.uniform(0.02, 0.08)
    bone = np.abs(np.sqrt(yy ** 2 + xx ** 2) - 0.45) < 0.03
    tex = np.sin(7 * yy + 3 * ss) * np.cos(5 * xx - 2 * ss)
    mr = np.where(body, 0.2 + 0.2 * tex + 0.4 * organ - 0.3 * bone, -1.0).astype(np.float32)
    mr += rng.normal(0, 0.02, mr.shape).astype(np.float32)
    ct = np.where(body, np.round((40 + 30 * tex + 400 * bone + 60 * organ) / 10) * 10, -1000.0)
    ct = np.clip(ct / 1000.0, -1, 1).astype(np.float32)
    return {"MR": mr, "CT": ct, "MASK": body.astype(np.float32)}


def generate(cfg: Config) -> Dict[str, Any]:
    """The seed's HDF5 file: /MR/<patient>, /CT/<patient>, /MASK/<patient>, (H,W,S) float32, gzip."""
    import h5py

    ctx = Ctx(cfg)
    done = ctx.src + ".done"
    if os.path.exists(done):
        with open(done) as f:
            st = json.load(f) if os.path.getsize(done) else {}
        st["note"] = (st.get("note", "") + "; reused").lstrip("; ")
        return st
    os.makedirs(os.path.dirname(ctx.src), exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    depths = rng.integers(cfg.slices_min, cfg.slices_max + 1, size=cfg.patients)
    t = time.perf_counter()
    gen_s = 0.0
    with h5py.File(ctx.src, "w") as f:
        for g in GROUPS:
            f.create_group(g)
        for p in range(cfg.patients):
            t1 = time.perf_counter()
            v = _volume(rng, ctx.H, ctx.W, int(depths[p]))
            gen_s += time.perf_counter() - t1
            for g in GROUPS:
                f[g].create_dataset(f"patient{p:03d}", data=v[g], compression="gzip")
    secs = time.perf_counter() - t - gen_s
    st = {"seconds": secs, "bytes": du(ctx.src), "path": ctx.src, "voxels": int(depths.sum()) * ctx.H * ctx.W,
            "depths": depths.tolist(),
            "note": "h5py create_dataset(data=(H,W,S) float32, compression='gzip'): auto chunks, gzip level 4; "
                    "seconds exclude making the synthetic arrays"}
    with open(done, "w") as f:
        json.dump(st, f)
    return st


def make_sequence(cfg: Config) -> Dict[str, Any]:
    import h5py

    ctx = Ctx(cfg)
    with h5py.File(ctx.src, "r") as f:
        patients = sorted(f["MR"].keys())
        depths = np.array([f["MR"][p].shape[-1] for p in patients], np.int64)
        chunks = str(f["MR"][patients[0]].chunks)
    rng = np.random.default_rng(cfg.seed + 2)
    first = np.concatenate([[0], np.cumsum(depths)])
    flat = rng.integers(0, int(first[-1]), size=cfg.seq_items)
    p2 = np.searchsorted(first, flat, side="right") - 1
    s2 = flat - first[p2]
    c = cfg.context
    centres = np.concatenate([first[p] + np.arange(c, depths[p] - c) for p in range(len(patients))])
    flat25 = centres[rng.integers(0, centres.size, size=cfg.seq_items)]
    p25 = np.searchsorted(first, flat25, side="right") - 1
    s25 = flat25 - first[p25]
    np.savez(os.path.join(ctx.root, "seq.npz"), patients=np.array(patients), depths=depths, first=first,
             p2d=p2, s2d=s2, p25d=p25, s25d=s25)
    return {"items": int(cfg.seq_items), "patients": len(patients), "slices": int(first[-1]),
            "gzip_chunks": chunks}


def read_reference(ctx: Ctx, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
    import h5py

    with h5py.File(ctx.src, "r") as f:
        return {g: np.ascontiguousarray(np.moveaxis(f[g][pid][:, :, s - c:s + c + 1], -1, 0)) for g in GROUPS}


# --------------------------------------------------------------------------- base


def _count(b: Dict[str, Any]) -> int:
    return int(b["MR"].shape[0])


class _VolSeqDS:
    """Map-style dataset over the shared sequence: index j -> (patient, slice), `context` neighbours each side."""

    def __init__(self, ctx: Ctx, variant: str) -> None:
        s = ctx.seq
        key = "25d" if variant == "2.5d" else "2d"
        self.p, self.s = s["p" + key], s["s" + key]
        self.patients = [str(x) for x in s["patients"]]
        self.c = ctx.context(variant)
        self.L = int(self.p.shape[0])

    def __len__(self) -> int:
        return self.L

    def __getstate__(self) -> Dict[str, Any]:
        """Drops per-process handles (see _per_process) when pickled for spawned workers."""
        d = dict(self.__dict__)
        for k in [k for k in d if k.endswith("_pid")]:
            d.pop(k, None)
            d.pop(k[:-4], None)
        return d

    def where(self, j: int) -> Tuple[str, int]:
        j %= self.L
        return self.patients[int(self.p[j])], int(self.s[j])

    def __getitem__(self, j: int) -> Dict[str, Any]:
        import torch

        pid, s = self.where(j)
        return {g: torch.from_numpy(a) for g, a in self.read(pid, s, self.c).items()}

    def read(self, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
        raise NotImplementedError


class Method:
    key = ""
    label = ""
    fmt: Optional[str] = None
    modes: Tuple[str, ...] = ("inproc", "dl2")
    variants: Tuple[str, ...] = ("2d", "2.5d")
    order = "the shared sequence"
    note = ""
    is_patchstore = False
    ds_class: Any = None

    def prepare(self, ctx: Ctx) -> Optional[Dict[str, Any]]:
        return None

    def dataset(self, ctx: Ctx, variant: str) -> Any:
        return _torchify(self.ds_class)(ctx, variant)

    collate = None
    mp_context: Optional[str] = None  # DataLoader multiprocessing_context (None: fork)

    def warmup(self, ctx: Ctx, mode: str, variant: str) -> int:
        return ctx.cfg.warmup_batches if mode == "inproc" else max(ctx.cfg.warmup_batches, 2 * ctx.cfg.workers + 1)

    def stream(self, ctx: Ctx, mode: str, variant: str):
        from torch.utils.data import DataLoader

        ds = self.dataset(ctx, variant)
        nw = 0 if mode == "inproc" else ctx.cfg.workers
        kw = {} if self.collate is None else {"collate_fn": self.collate}
        if nw and self.mp_context:
            kw["multiprocessing_context"] = self.mp_context
            kw["persistent_workers"] = True
        dl = DataLoader(ds, batch_size=ctx.cfg.vol_batch, sampler=SeqSampler(len(ds)), num_workers=nw,
                        prefetch_factor=2 if nw else None, **kw)
        it = iter(dl)
        return it, _count, lambda: shutdown_loader(it)

    def check(self, ctx: Ctx) -> str:
        worst = 0.0
        for variant in self.variants:
            ds = self.dataset(ctx, variant)
            for j in range(4):
                pid, s = ds.where(j)
                c = ctx.context(variant)
                ref = read_reference(ctx, pid, s, c)
                got = ds[j]
                for g in GROUPS:
                    worst = max(worst, float(np.abs(np.asarray(got[g]) - ref[g]).max()))
        return "identical to the source" if worst == 0 else f"max |difference| to the source: {worst:.3g}"


def _per_process(obj: Any, attr: str, make: Callable[[], Any]) -> Any:
    """obj.<attr>, (re)made in each process (file handles must not cross fork)."""
    pid = os.getpid()
    cur = obj.__dict__.get(attr)
    if cur is None or obj.__dict__.get(attr + "_pid") != pid:
        cur = make()
        obj.__dict__[attr] = cur
        obj.__dict__[attr + "_pid"] = pid
    return cur


# --------------------------------------------------------------------------- h5py


class H5HwsDS(_VolSeqDS):
    def __init__(self, ctx: Ctx, variant: str) -> None:
        super().__init__(ctx, variant)
        self.path = ctx.src

    def read(self, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
        import h5py

        f = _per_process(self, "h5", lambda: h5py.File(self.path, "r"))
        if c == 0:  # the seed: self.h5file["MR"][patient_key][..., slice_idx]
            return {g: f[g][pid][..., s][None] for g in GROUPS}
        return {g: np.ascontiguousarray(np.moveaxis(f[g][pid][..., s - c:s + c + 1], -1, 0)) for g in GROUPS}


class H5Hws(Method):
    key = "h5_hws_gzip"
    label = "h5py, (H,W,S) gzip, auto chunks (the seed's file)"
    fmt = "h5_hws_gzip"
    ds_class = H5HwsDS
    note = "the seed's Dataset: file opened once per worker, f[group][patient][..., s] per field"

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        g = generate(ctx.cfg)  # the source itself; its stats were saved by the 'gen' stage
        return {"seconds": g.get("seconds"), "bytes": du(ctx.src), "path": ctx.src,
                "note": "the seed's file as written by the harness"}


class H5ShwDS(_VolSeqDS):
    def __init__(self, ctx: Ctx, variant: str) -> None:
        super().__init__(ctx, variant)
        self.path = os.path.join(ctx.fmt, "h5_shw", "synthrad_shw.h5")

    def read(self, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
        import h5py

        f = _per_process(self, "h5", lambda: h5py.File(self.path, "r"))
        return {g: f[g][pid][s - c:s + c + 1] for g in GROUPS}


def _convert_volumes(ctx: Ctx, name: str, write: Callable[[str, str, np.ndarray], None],
                     finish: Optional[Callable[[], None]] = None, start: Optional[Callable[[], None]] = None,
                     out: Optional[str] = None) -> Dict[str, Any]:
    """Reads every (group, patient) of the seed's file as (S,H,W) float32 and hands it to `write`."""
    import h5py

    out = out or os.path.join(ctx.fmt, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    t = time.perf_counter()
    if start is not None:
        start()
    with h5py.File(ctx.src, "r") as f:
        for pid in sorted(f["MR"].keys()):
            for g in GROUPS:
                write(g, pid, np.ascontiguousarray(np.moveaxis(f[g][pid][()], -1, 0), dtype=np.float32))
    if finish is not None:
        finish()
    return {"seconds": time.perf_counter() - t, "bytes": du(out), "path": out}


class H5Shw(Method):
    key = "h5_shw_chunk"
    label = "h5py, (S,H,W), (1,H,W) chunks, uncompressed (the answer's layout)"
    fmt = "h5_shw"
    ds_class = H5ShwDS
    note = "f[group][patient][s] per field, file opened once per worker"

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import h5py

        path = os.path.join(ctx.fmt, "h5_shw", "synthrad_shw.h5")
        st: Dict[str, Any] = {}

        def start() -> None:
            st["f"] = h5py.File(path, "w")

        def write(g: str, pid: str, v: np.ndarray) -> None:
            grp = st["f"].require_group(g)
            grp.create_dataset(pid, data=v, chunks=(1,) + v.shape[1:])

        def finish() -> None:
            st["f"].close()

        return _convert_volumes(ctx, "h5_shw", write, finish, start)


# --------------------------------------------------------------------------- zarr / tensorstore


class ZarrDS(_VolSeqDS):
    def __init__(self, ctx: Ctx, variant: str) -> None:
        super().__init__(ctx, variant)
        self.path = os.path.join(ctx.fmt, "zarr", "synthrad.zarr")

    def read(self, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
        import zarr

        arrays = _per_process(self, "arrays", dict)
        out = {}
        for g in GROUPS:
            a = arrays.get((g, pid))
            if a is None:
                a = arrays[(g, pid)] = zarr.open_array(os.path.join(self.path, g, pid), mode="r")
            out[g] = a[s - c:s + c + 1]
        return out


class Zarr(Method):
    key = "zarr"
    label = "zarr 3 ((1,H,W) chunks, no compressor)"
    fmt = "zarr"
    ds_class = ZarrDS
    note = "one array per (group, patient), opened once per process; a[s-c:s+c+1] per field"

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import zarr

        root = os.path.join(ctx.fmt, "zarr", "synthrad.zarr")

        def write(g: str, pid: str, v: np.ndarray) -> None:
            zarr.create_array(os.path.join(root, g, pid), data=v, chunks=(1,) + v.shape[1:], compressors=None,
                              filters=None, zarr_format=3)

        return _convert_volumes(ctx, "zarr", write)


class TensorStoreDS(_VolSeqDS):
    def __init__(self, ctx: Ctx, variant: str) -> None:
        super().__init__(ctx, variant)
        self.path = os.path.join(ctx.fmt, "zarr", "synthrad.zarr")

    def read(self, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
        import tensorstore as ts

        arrays = _per_process(self, "arrays", dict)
        out = {}
        for g in GROUPS:
            a = arrays.get((g, pid))
            if a is None:
                a = arrays[(g, pid)] = ts.open({"driver": "zarr3", "kvstore": {
                    "driver": "file", "path": os.path.join(self.path, g, pid)}}, read=True).result()
            out[g] = a[s - c:s + c + 1].read().result()
        return out


class TensorStore(Method):
    key = "tensorstore"
    label = "TensorStore (zarr3 driver on the zarr store above)"
    fmt = "zarr"
    ds_class = TensorStoreDS
    mp_context = "spawn"
    note = ("ts.open once per (group, patient) and process; a[s-c:s+c+1].read().result() per field; TensorStore is "
            "not fork-safe once used in the parent (forked workers die), so its DataLoader uses "
            "multiprocessing_context='spawn' (start-up excluded by the warm-up)")

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        return Zarr().prepare(ctx) if not os.path.isdir(os.path.join(ctx.fmt, "zarr")) else None


# --------------------------------------------------------------------------- numpy / lmdb


class MemmapDS(_VolSeqDS):
    def __init__(self, ctx: Ctx, variant: str) -> None:
        super().__init__(ctx, variant)
        self.dir = os.path.join(ctx.fmt, "npy")

    def read(self, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
        maps = _per_process(self, "maps", dict)
        out = {}
        for g in GROUPS:
            a = maps.get((g, pid))
            if a is None:
                a = maps[(g, pid)] = np.load(os.path.join(self.dir, f"{g}_{pid}.npy"), mmap_mode="r")
            out[g] = np.array(a[s - c:s + c + 1])
        return out


class Memmap(Method):
    key = "npy_memmap"
    label = "numpy.memmap of (S,H,W) float32 .npy"
    fmt = "npy"
    ds_class = MemmapDS
    note = "np.load(mmap_mode='r') once per file and process; np.array(a[s-c:s+c+1]) per field"

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        d = os.path.join(ctx.fmt, "npy")
        return _convert_volumes(ctx, "npy", lambda g, pid, v: np.save(os.path.join(d, f"{g}_{pid}.npy"), v))


class LmdbDS(_VolSeqDS):
    def __init__(self, ctx: Ctx, variant: str) -> None:
        super().__init__(ctx, variant)
        self.dir = os.path.join(ctx.fmt, "lmdb")
        self.hw = (ctx.H, ctx.W)

    def read(self, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
        import lmdb

        env = _per_process(self, "env", lambda: lmdb.open(self.dir, readonly=True, lock=False, readahead=False,
                                                          meminit=False, max_readers=64))
        n = 2 * c + 1
        out = {g: np.empty((n,) + self.hw, np.float32) for g in GROUPS}
        with env.begin(buffers=True) as txn:
            for i in range(n):
                rec = np.frombuffer(txn.get(f"{pid}/{s - c + i}".encode()), np.float32).reshape((3,) + self.hw)
                for gi, g in enumerate(GROUPS):
                    out[g][i] = rec[gi]
        return out


class Lmdb(Method):
    key = "lmdb"
    label = "LMDB (py-lmdb), one record per slice (MR,CT,MASK as (3,H,W) float32)"
    fmt = "lmdb"
    ds_class = LmdbDS
    note = "txn.get with buffers=True + numpy.frombuffer; 2.5D = 5 gets"

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import h5py
        import lmdb

        d = os.path.join(ctx.fmt, "lmdb")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        t = time.perf_counter()
        with h5py.File(ctx.src, "r") as f:
            pids = sorted(f["MR"].keys())
            total = sum(f["MR"][p].size for p in pids) * 3 * 4
            env = lmdb.open(d, map_size=int(total * 1.5) + (64 << 20), sync=False, metasync=False)
            for pid in pids:
                vols = [np.moveaxis(f[g][pid][()], -1, 0) for g in GROUPS]
                with env.begin(write=True) as txn:
                    for s in range(vols[0].shape[0]):
                        rec = np.ascontiguousarray(np.stack([v[s] for v in vols]), dtype=np.float32)
                        txn.put(f"{pid}/{s}".encode(), rec.tobytes())
            env.sync(True)
            env.close()
        return {"seconds": time.perf_counter() - t, "bytes": du(d), "path": d}


# --------------------------------------------------------------------------- MONAI


class MonaiSlices(Method):
    key = "monai_slices"
    label = "MONAI 2D-slice recipe (LoadImaged NIfTI -> GridPatchDataset + PatchIterd)"
    fmt = "nifti"
    order = "volume by volume, slices in order (GridPatchDataset is iterable)"
    note = ("the MONAI tutorial's recipe: monai.data.Dataset(LoadImaged(reader='NibabelReader'), "
            "EnsureChannelFirstd) -> GridPatchDataset(PatchIterd(patch_size=(None, None, n))); each volume is "
            "loaded whole, then its slices are yielded; workers split the volumes. 2.5D: PatchIterd has no overlap, "
            "so items are non-overlapping 5-slice stacks (5x fewer items per volume load)")

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        import nibabel as nib

        d = os.path.join(ctx.fmt, "nifti")

        def write(g: str, pid: str, v: np.ndarray) -> None:  # v (S,H,W) -> NIfTI (H,W,S) like the source
            nib.save(nib.Nifti1Image(np.ascontiguousarray(np.moveaxis(v, 0, -1)), np.eye(4)),
                     os.path.join(d, f"{pid}_{g}.nii"))

        return _convert_volumes(ctx, "nifti", write)

    def _dataset(self, ctx: Ctx, variant: str):
        from monai.data import Dataset as MDataset
        from monai.data import GridPatchDataset, PatchIterd
        from monai.transforms import Compose, EnsureChannelFirstd, Lambdad, LoadImaged

        d = os.path.join(ctx.fmt, "nifti")
        files = [{g: os.path.join(d, f"{pid}_{g}.nii") for g in GROUPS} for pid in ctx.patients]
        keys = list(GROUPS)
        vol_tf = Compose([LoadImaged(keys=keys, reader="NibabelReader", image_only=True),
                          EnsureChannelFirstd(keys=keys, channel_dim="no_channel")])
        n = 2 * ctx.context(variant) + 1
        patch_iter = PatchIterd(keys=keys, patch_size=(None, None, n), start_pos=(0, 0, 0))
        # (1,H,W,n) -> (n,H,W)
        patch_tf = Lambdad(keys=keys, func=lambda x: x[0].permute(2, 0, 1))
        return GridPatchDataset(data=MDataset(files, transform=vol_tf), patch_iter=patch_iter, transform=patch_tf,
                                with_coordinates=False)

    def stream(self, ctx: Ctx, mode: str, variant: str):
        from torch.utils.data import DataLoader

        ds = self._dataset(ctx, variant)
        nw = 0 if mode == "inproc" else ctx.cfg.workers
        dl = DataLoader(ds, batch_size=ctx.cfg.vol_batch, num_workers=nw, persistent_workers=nw > 0,
                        prefetch_factor=2 if nw else None)
        return forever(lambda: dl), _count, lambda: None

    def check(self, ctx: Ctx) -> str:
        ds = self._dataset(ctx, "2d")
        item = next(iter(ds))
        ref = read_reference(ctx, ctx.patients[0], 0, 0)
        worst = max(float(np.abs(np.asarray(item[g]) - ref[g]).max()) for g in GROUPS)
        return ("identical to the source (first slice)" if worst == 0
                else f"max |difference| to the source: {worst:.3g}")


# --------------------------------------------------------------------------- patchstore


def patchstore_cli() -> str:
    return os.environ.get("PATCHSTORE_CLI") or os.path.join(ROOT, "build", "patchstore")


def _ingest(ctx: Ctx) -> Dict[str, Any]:
    store = ctx.store_path()
    shutil.rmtree(os.path.dirname(store), ignore_errors=True)
    os.makedirs(os.path.dirname(store))
    cmd = [patchstore_cli(), "-q", "ingest", "hdf5", ctx.src, store, "--group", "MR", "--group", "CT",
           "--group", "MASK", "--no-sync"]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return {"seconds": secs, "bytes": du(store), "path": store,
            "note": "patchstore ingest hdf5 FILE.h5 STORE --group MR --group CT --group MASK --no-sync"}


class StoreDS(_VolSeqDS):
    def __init__(self, ctx: Ctx, variant: str) -> None:
        import patchstore

        super().__init__(ctx, variant)
        self.store = patchstore.open(ctx.store_path())  # pickles as its path; reopens after fork

    def read(self, pid: str, s: int, c: int) -> Dict[str, np.ndarray]:
        return {g: np.array(self.store.get(pid, g)[s - c:s + c + 1]) for g in GROUPS}


class PatchStoreRaw(Method):
    key = "patchstore_store"
    label = "patchstore Store.get(patient, field)[s-c:s+c+1] (zero-copy view + one copy)"
    fmt = "patchstore"
    is_patchstore = True
    ds_class = StoreDS
    note = ("the plain Store API (no SliceDataset): a (S,H,W) view of the record, sliced, copied once, "
            "default_collate")

    def prepare(self, ctx: Ctx) -> Dict[str, Any]:
        return _ingest(ctx)


class PatchStoreSliceDataset(Method):
    key = "patchstore_slicedataset"
    label = "patchstore.torch.SliceDataset"
    fmt = "patchstore"
    is_patchstore = True
    order = "the shared sequence, mapped to SliceDataset indices with dataset.ref(i)"
    note = ("detected with hasattr; SliceDataset(store, ('MR', 'CT', 'MASK'), context=0 or 2) with slice_collate: "
            "each batch gathered by one C++ call per field")

    def available(self) -> Optional[str]:
        try:
            import patchstore.torch as pt
        except Exception as e:  # noqa: BLE001
            return f"patchstore not importable: {e}"
        if not hasattr(pt, "SliceDataset"):
            return "not available in this build: patchstore.torch has no SliceDataset"
        return None

    def dataset(self, ctx: Ctx, variant: str) -> Any:
        import inspect

        import patchstore.torch as pt

        SD = pt.SliceDataset
        c = ctx.context(variant)
        tries = [
            lambda: SD(ctx.store_path(), list(GROUPS), context=c),
            lambda: SD(ctx.store_path(), fields=list(GROUPS), context=c),
            lambda: SD(ctx.store_path(), list(GROUPS), c),
        ]
        errors = []
        for t in tries:
            try:
                ds = t()
                ds.L = len(ds)
                return ds
            except TypeError as e:
                errors.append(str(e))
        raise TypeError(f"could not construct SliceDataset{inspect.signature(SD)}: {'; '.join(errors)}")

    def _order(self, ctx: Ctx, ds: Any, variant: str) -> Tuple[np.ndarray, str]:
        """The shared sequence as SliceDataset indices (through dataset.ref), else random indices."""
        try:
            where = {}
            for i in range(len(ds)):
                r = ds.ref(i)
                where[(str(r[0]), int(r[1]))] = i
            key = "25d" if variant == "2.5d" else "2d"
            pats = ctx.patients
            order = np.array([where[(pats[int(p)], int(s))]
                              for p, s in zip(ctx.seq["p" + key], ctx.seq["s" + key])], np.int64)
            return order, "the shared sequence (mapped with dataset.ref)"
        except Exception as e:  # noqa: BLE001
            rng = np.random.default_rng(ctx.cfg.seed + 3)
            return rng.integers(0, len(ds), size=ctx.cfg.seq_items), f"random indices ({fmt_error(e)})"

    def stream(self, ctx: Ctx, mode: str, variant: str):
        from torch.utils.data import DataLoader

        import patchstore.torch as pt

        ds = self.dataset(ctx, variant)
        order, _ = self._order(ctx, ds, variant)

        class S:
            def __iter__(self):
                j = 0
                while True:
                    yield int(order[j % order.size])
                    j += 1

        nw = 0 if mode == "inproc" else ctx.cfg.workers
        coll = getattr(pt, "slice_collate", None) or pt.collate
        dl = DataLoader(ds, batch_size=ctx.cfg.vol_batch, sampler=S(), num_workers=nw, collate_fn=coll,
                        prefetch_factor=2 if nw else None)
        it = iter(dl)

        def count(b: Any) -> int:
            if isinstance(b, dict):
                return int(b["MR"].shape[0])
            return int(b[0].shape[0])

        return it, count, lambda: shutdown_loader(it)

    def check(self, ctx: Ctx) -> str:
        worst = 0.0
        how = ""
        for variant in self.variants:
            ds = self.dataset(ctx, variant)
            order, how = self._order(ctx, ds, variant)
            c = ctx.context(variant)
            key = "25d" if variant == "2.5d" else "2d"
            for j in range(4):
                pid, s = ctx.patients[int(ctx.seq["p" + key][j])], int(ctx.seq["s" + key][j])
                ref = read_reference(ctx, pid, s, c)
                item = ds[int(order[j])]
                got = dict(zip(GROUPS, item)) if not isinstance(item, dict) else item
                for g in GROUPS:
                    worst = max(worst, float(np.abs(np.asarray(got[g]) - ref[g]).max()))
        self.order = how
        return ("identical to the source" if worst == 0 else f"max |difference| to the source: {worst:.3g}") + \
            f"; order: {how}"


class RamSlices(Method):
    key = "ram_slices"
    label = "reference: in-RAM slice copy ((S,H,W) float32 arrays in RAM, np.copyto into a batch)"
    modes = ("inproc",)
    note = "all volumes loaded into RAM beforehand; the sequence's slices copied into a preallocated batch"

    def stream(self, ctx: Ctx, mode: str, variant: str):
        import h5py

        with h5py.File(ctx.src, "r") as f:
            vols = {(g, pid): np.ascontiguousarray(np.moveaxis(f[g][pid][()], -1, 0))
                    for pid in ctx.patients for g in GROUPS}
        key = "25d" if variant == "2.5d" else "2d"
        P, S = ctx.seq["p" + key], ctx.seq["s" + key]
        pats = ctx.patients
        L, B, c = int(P.shape[0]), ctx.cfg.vol_batch, ctx.context(variant)
        out = {g: np.empty((B, 2 * c + 1, ctx.H, ctx.W), np.float32) for g in GROUPS}

        def gen():
            j = 0
            while True:
                for b in range(B):
                    pid, s = pats[int(P[j % L])], int(S[j % L])
                    for g in GROUPS:
                        np.copyto(out[g][b], vols[(g, pid)][s - c:s + c + 1])
                    j += 1
                yield out

        return gen(), _count, lambda: None

    def check(self, ctx: Ctx) -> str:
        return "reference"


# --------------------------------------------------------------------------- registry

_TORCHIFIED: Dict[type, type] = {}


def _torchify(cls: type) -> type:
    if cls not in _TORCHIFIED:
        from torch.utils.data import Dataset

        t = type(cls.__name__ + "_T", (cls, Dataset), {"__module__": __name__})
        _TORCHIFIED[cls] = t
        globals()[t.__name__] = t
    return _TORCHIFIED[cls]


METHODS: List[Method] = [
    H5Hws(), H5Shw(), Zarr(), TensorStore(), MonaiSlices(), Memmap(), Lmdb(), PatchStoreRaw(),
    PatchStoreSliceDataset(), RamSlices(),
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
