"""patchstore.export and Store.montage: the command line's export and montage, from Python.

The compiled module (``patchstore._ingest``, which links OpenCV, OpenEXR and
HDF5) is imported on first use, so processes that only read never load it.
The GIL is released while they run.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from ._config import UNSET, SamplerConfig, SliceConfig, positional_options, resolve_config, resolve_slice_config
from ._ingest_api import _require_ingest
from ._ingest_args import PathLike
from ._sampler_options import to_native
from ._slice_options import to_native as slice_to_native
from ._store import Store, _encode_id, reader_of, register_layer

__all__ = ["export", "ExportSummary"]  # and montage through Store.montage


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote (patchstore::ExportSummary)."""

    files_written: int
    bytes_written: int
    paths: List[str] = field(default_factory=list)  #: the first 1000 files written
    #: e.g. a window far wider than a normalised field's stored values (windows are in stored units)
    warnings: List[str] = field(default_factory=list)


def export(
    store: Union[PathLike, Store],
    outdir: PathLike,
    ids: Optional[Iterable[Union[str, bytes]]] = None,
    fields: Optional[Iterable[str]] = None,
    format: Optional[str] = None,
    window: Union[None, str, Tuple[float, float]] = None,
    *,
    axis_order: Optional[str] = None,
    progress: Optional[Callable[[Any], None]] = None,
) -> ExportSummary:
    """Writes records back to files: OUTDIR/<safe id>/<field>.<ext>.

    Same options as ``patchstore export``. ids / fields: a selection (None:
    all). format: None (by source: png for integer sources, exr for float),
    "png", "exr" or "h5". window: (lo, hi) for float data written as PNG,
    in STORED units (after the ingest normalisation: a CT ingested with
    range:-1024,3000 holds -1..1), or "auto" (each record's 1st..99th
    percentile). A window far off a normalised field's values warns.
    PNG output inverts the stored normalisation and keeps the source bit
    depth and channels; EXR output is float32, bit-exact. Ids are made safe as
    paths (each '/'-part a folder; other bytes percent-encoded).

    Volume stores (from `ingest_hdf5` or `ingest_volumes`): format "png" (default) writes
    OUTDIR/<id>/<field>/<slice:04>.png, one 8-bit gray PNG per slice, window
    (lo, hi) -> [0, 255] (default: each volume's finite min..max); format
    "h5" writes one file OUTDIR/volumes.h5 mirroring the source (one group per
    field, one float32 dataset per id, values bit-exact) with axis_order
    "source" (default: the slice axis back where it was in the HDF5 input)
    or "shw" (slices first, as stored). Format "nifti" (OUTDIR/<id>/<field>.nii.gz)
    or "mha" (OUTDIR/<id>/<field>.mha) writes one float32 file per (volume,
    field), voxel for voxel the stored values, with the volume's stored
    geometry (`ingest_volumes`), so nibabel and SimpleITK read back the
    same affine; these need a build with ITK.

    Raises FileNotFoundError for a missing store, KeyError for an unknown id
    or field, OSError when writing fails. The GIL is released while it runs.
    """
    _require_ingest("patchstore.export")
    if isinstance(store, Store):
        path = store.path
    else:
        path = Store(store).path  # FileNotFoundError here, before any output is written
    auto = isinstance(window, str) and window == "auto"
    if window is not None and not auto:
        lo, hi = (float(v) for v in window)
    else:
        lo, hi = 0.0, 1.0
    if isinstance(ids, (str, bytes)):
        ids = [ids]
    if isinstance(fields, str):
        fields = [fields]
    if axis_order is not None and axis_order not in ("source", "shw"):
        raise ValueError(f"export: axis_order must be 'source' or 'shw', not {axis_order!r}")
    from . import _ingest

    d = _ingest.export(
        path,
        os.fspath(outdir),
        [] if ids is None else [_encode_id(i) for i in ids],
        [] if fields is None else list(fields),
        "" if format is None else str(format),
        window is not None and not auto,
        lo,
        hi,
        progress,
        "" if axis_order is None else axis_order,
        auto,
    )
    summary = ExportSummary(**d)
    for w in summary.warnings:
        warnings.warn(f"patchstore.export: {w}", RuntimeWarning, stacklevel=2)
    return summary


def _loader_options(loader: Any) -> Tuple[str, Dict[str, Any]]:
    """(kind, options) of a loader object: PatchSampler, torch BatchLoader or PatchDataset."""
    name = type(loader).__name__
    kinds = {"PatchSampler": "sampler", "BatchLoader": "batchloader", "PatchDataset": "patchdataset"}
    if name not in kinds:
        raise TypeError(f"montage: loader must be 'sampler', 'batchloader', 'patchdataset' or one of those "
                        f"loaders, got {loader!r}")
    o = loader.sampler.options if name == "BatchLoader" else loader.options
    return kinds[name], o


def montage(
    path: str,
    count: int = 64,
    patch_size: Any = UNSET,
    field: Optional[str] = None,
    overlay: Optional[str] = None,
    seed: Any = UNSET,
    *,
    epoch: int = 0,
    window: Optional[Tuple[float, float]] = None,
    tile: Optional[int] = None,
    loader: Any = "sampler",
    return_windows: bool = False,
    config: Optional[SamplerConfig] = None,
    **options: Any,
) -> Any:
    """patchstore::RenderMontage as an (H, W, 3) uint8 NumPy array (see Store.montage).

    Every option of the loaders, with their meaning, defaults and checks:
    ``config=SamplerConfig(...)`` and/or the same options as keywords
    (patch_size P or (h, w), require, min_valid, positive_fraction, policy,
    flip, rot90, ids, rank, world_size, ...). require None (the default)
    means "the overlay field". loader: "sampler"/"batchloader" (permutation
    order, the same windows), "patchdataset" (items 0, 1, ... in index
    order), or a loader object (PatchSampler, BatchLoader, PatchDataset)
    whose own options are used: the sheet shows exactly the first ``count``
    windows that loader serves in ``epoch``. Samples without a qualifying
    window are skipped as the loaders skip them, with one RuntimeWarning.
    With return_windows, (sheet, windows): the tiles' int64 rows (sample,
    y, x, flip, rot, positive), in order.
    """
    _require_ingest("montage")
    import numpy as np

    count = int(count)
    if not 1 <= count <= 4096:
        raise ValueError(f"montage: count must be in 1..4096, got {count}")
    from ._sampler_options import _position
    epoch = _position(epoch, "epoch", "montage: ")
    if tile is not None and not 8 <= int(tile) <= 4096:
        raise ValueError(f"montage: tile must be in 8..4096, got {tile}")
    if window is not None:
        lo, hi = (float(v) for v in window)
    else:
        lo, hi = 0.0, 1.0
    options = positional_options("montage", patch_size, (), (), options)
    if seed is not UNSET:
        options["seed"] = seed
    if isinstance(loader, str):
        kind = loader
        if kind not in ("sampler", "batchloader", "patchdataset"):
            raise ValueError(f"montage: loader must be 'sampler', 'batchloader' or 'patchdataset' (or one of "
                             f"those loaders), got {loader!r}")
        cfg = resolve_config(config, options, "montage")
        require_overlay = cfg.require is None
    else:
        # The loader's own options: exactly the windows it serves.
        if config is not None or options:
            raise ValueError("montage: a loader object brings its own options; give no config or sampling "
                             f"keywords with it (got {sorted(options) or 'config'})")
        kind, pub = _loader_options(loader)
        if pub.get("order", "random") != "random":
            raise ValueError("montage: this loader uses order='locality'; montage shows the windows of the random "
                             "order only (build the loader with order='random' to see them)")
        require_overlay = False
        cfg = SamplerConfig(**{k: v for k, v in pub.items() if k != "fields"})
    o = to_native([field or "-"], cfg, "montage")
    from . import _ingest

    h, w, pixels, wins, notes = _ingest.render_montage(
        path, count, o, field or "", overlay or "", require_overlay, int(epoch), window is not None, lo, hi,
        0 if tile is None else int(tile), loader=kind, with_windows=True)
    for note in notes:
        warnings.warn(f"patchstore montage: {note}", RuntimeWarning, stacklevel=4)
    sheet = np.frombuffer(pixels, dtype=np.uint8).reshape(h, w, 3)
    if return_windows:
        return sheet, np.array(wins, dtype=np.int64).reshape(-1, 6)
    return sheet


def volume_montage(
    path: str,
    count: int = 64,
    field: Optional[str] = None,
    overlay: Optional[str] = None,
    *,
    config: Optional[SliceConfig] = None,
    epoch: int = 0,
    window: Any = None,
    tile: Optional[int] = None,
    labels: bool = True,
    **options: Any,
) -> Any:
    """patchstore::RenderVolumeMontage as an (H, W, 3) uint8 NumPy array (see Store.montage).

    options: SliceDataset's (SliceConfig: context, crop, flip, rot90, seed, require, min_valid,
    positive_fraction, ids, ...), checked by the same C++ code; context may name any field of the store.
    """
    _require_ingest("montage")
    import numpy as np

    count = int(count)
    if not 1 <= count <= 4096:
        raise ValueError(f"montage: count must be in 1..4096, got {count}")
    from ._sampler_options import _position
    epoch = _position(epoch, "epoch", "montage: ")
    if tile is not None and not 8 <= int(tile) <= 4096:
        raise ValueError(f"montage: tile must be in 8..4096, got {tile}")
    cfg = resolve_slice_config(config, options, "montage")
    store = Store(path)
    slices = slice_to_native(list(store.fields), cfg, "montage", store)
    if window is None or (isinstance(window, str) and window == "auto"):
        has_window, lo, hi = False, 0.0, 1.0
    else:
        lo, hi = (float(v) for v in window)
        if not lo < hi:
            raise ValueError(f"montage: window needs lo < hi, got {window!r}")
        has_window = True
    from . import _ingest

    h, w, pixels, _, _, warning = _ingest.render_volume_montage(
        path, count, field or "", overlay or "", slices, int(epoch), has_window, lo, hi,
        0 if tile is None else int(tile), bool(labels))
    if warning:
        warnings.warn(f"patchstore montage of '{path}': {warning}", RuntimeWarning, stacklevel=3)
    return np.frombuffer(pixels, dtype=np.uint8).reshape(h, w, 3)


def store_montage(store: Store, count: int, patch_size: Any = UNSET, field: Optional[str] = None,
                  overlay: Optional[str] = None, seed: Any = UNSET, **options: Any) -> Any:
    """A contact sheet of the windows a PatchSampler with these options serves first: (H, W, 3) uint8.

    Volume stores: the slices a `patchstore.torch.SliceDataset`
    with the same options (``patchstore.SliceConfig``: ``crop``,
    ``context``, ``flip`` (False, True or "independent"), ``rot90``,
    ``seed``, ``ids``, ``require``, ``min_valid``, ``positive_fraction``;
    or ``config=SliceConfig(...)``) serves in ``epoch``: ``count`` items
    spread evenly over the dataset (item ``j * len // count``), each tile
    the centre slice of the item's stack, cropped, flipped and turned as
    the dataset does, in gray: ``window`` (lo, hi) in stored units (after
    the ingest normalisation) onto 0..255, default "auto" (the 1st..99th
    percentile of the shown values); tiles labelled "<id> s<slice>"
    (``labels=False`` for none); ``overlay`` a mask field drawn in red
    (unlike image stores, it does not imply ``require``). ``patch_size``
    and ``patches_per_sample`` do not apply.

    The same picture as ``patchstore montage`` (ingest/montage.h): the
    first `count` windows of `epoch` (continuing into later epochs) of a
    sampler with this `seed`, `patch_size`, `patches_per_sample`,
    `require`, `flip` and `rot90`, each tile labelled with its sample id
    and position. field: the field shown (default: the store's first).
    overlay: a mask field drawn as a translucent red overlay; by default
    the windows must then hold one of its pixels (require=None means
    "the overlay field"; require="" samples uniformly; require="name"
    uses that mask). window: (lo, hi) display range for float fields
    (default: each tile's own range); integer-sourced fields invert
    their stored normalisation. tile: tile size in pixels (default
    min(patch_size, 256)).

    Images: every loader option too (min_valid, ..., ids), loader=, return_windows= (_export_api.montage).

    Loads the ingest module (OpenCV) on first use. Errors as
    PatchSampler: KeyError for an unknown field, ValueError for bad
    options, IndexError when no sample has an admissible window.

    Implements Store.montage.
    """
    reader_of(store)  # FileNotFoundError / closed store here
    path = store.path
    if store.kind == "volumes":
        if seed is not UNSET:
            options["seed"] = seed
        return volume_montage(path, count, field, overlay, **options)
    if any(k in options for k in ("crop", "context")):
        raise ValueError(f"montage: crop and context are for volume stores; '{path}' holds images "
                         f"(use patch_size)")
    options.pop("labels", None)
    window = options.get("window")
    if isinstance(window, str):
        options["window"] = None if window == "auto" else window
    return montage(path, count, patch_size, field, overlay, seed, **options)


register_layer("montage", store_montage)
