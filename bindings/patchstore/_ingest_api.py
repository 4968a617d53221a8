"""patchstore.ingest_images and ingest_hdf5: the command line's ingest, from Python (export: _export_api.py).

The compiled module (``patchstore._ingest``, which links OpenCV, OpenEXR and HDF5) is imported on first use,
so processes that only read never load it. A reader-only build has no such module: every function that needs
it raises ImportError saying so (`_require_ingest`). Both calls release the GIL while they run.
"""

from __future__ import annotations

import importlib
import operator
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._ingest_args import EncodingArg, PathLike, _encoding_specs, _layout_arg, _sources
from ._progress import ProgressArg, Reporter

__all__ = ["ingest_images", "ingest_hdf5", "IngestSummary"]


@dataclass(frozen=True)
class IngestSummary:
    """What an ingest did (patchstore::IngestSummary)."""

    samples_total: int  #: samples found in the input
    samples_written: int  #: newly committed
    samples_present: int  #: already in the store (resume)
    samples_failed: int  #: skipped because of errors (on_error="skip")
    bytes_written: int  #: float32 payload bytes committed
    bytes_decoded: int
    seconds: float
    report_path: str  #: where failures were written, if any
    errors: List[str] = field(default_factory=list)  #: one message per failed sample (first 100)
    #: things that went through but look wrong (HDF5: a patient under two file prefixes, slices much
    #: thinner one way than another slice axis would give, an all-zero mask; images: 32-bit integer
    #: values above 2^24, which float32 rounds); each also warned
    warnings: List[str] = field(default_factory=list)
    report_error: str = ""  #: why the failure report could not be written ("" when it was, or was not needed)
    #: the store's projected data.mdb bytes, reported before the first write (0: nothing was written)
    projected_bytes: int = 0
    #: this machine's RAM the projection was set against (PATCHSTORE_ASSUME_RAM_BYTES when set)
    ram_bytes: int = 0
    #: when the store is larger than half of RAM: the flags that serve a store read from disk and were not
    #: given, e.g. "--layout tiles --encoding compact --encoding depth=float16" ("" otherwise)
    advice: str = ""


def _require_ingest(what: str) -> None:
    """Raises ImportError naming `what` when this build has no ``patchstore._ingest`` (a reader-only build:
    CMake PATCHSTORE_INGEST=OFF, or AUTO without the codec libraries)."""
    module = f"{__package__}._ingest"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise ImportError(
            f"{what}: this build of patchstore has no ingest (built with PATCHSTORE_INGEST=OFF, or without "
            "OpenCV, libtiff, OpenEXR and HDF5): reading, sampling and patchstore.torch work here; ingest, "
            "export, montage and copy need a build with those libraries (see the manual's install page)",
            name=module,
        ) from None


def _run_cancellable(call: Callable[[Any], Any], reporter: Optional[Reporter] = None) -> Any:
    try:
        return _run_cancellable_inner(call)
    finally:
        if reporter is not None:
            reporter.close()


def _run_cancellable_inner(call: Callable[[Any], Any]) -> Any:
    """Runs call(cancel_flag) so that Ctrl-C stops it cleanly.

    In the main thread the C++ call runs on a helper thread (it releases
    the GIL) while this thread waits in short intervals, so it sees
    KeyboardInterrupt. The first Ctrl-C sets the cancel flag, waits for the
    call to return (the ingest commits what it decoded, then stops) and
    re-raises KeyboardInterrupt; a second Ctrl-C while waiting stops
    waiting and raises at once (the cancelled ingest still finishes its last
    commit on the helper thread, which the interpreter waits for at exit).
    From other threads the call runs directly.
    """
    from . import _ingest  # imported when first used: it links the decoders

    flag = _ingest.CancelFlag()
    if threading.current_thread() is not threading.main_thread():
        return call(flag)
    result: Dict[str, Any] = {}
    # Waiting on an Event, not Thread.join: a join interrupted by Ctrl-C can
    # mark a running thread as stopped (CPython 3.11, bpo-45274's fix).
    done = threading.Event()

    def run() -> None:
        try:
            result["value"] = call(flag)
        except BaseException as e:  # handed to the waiting thread
            result["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=run, name="patchstore-ingest")
    worker.start()
    try:
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        flag.set()
        try:
            while not done.wait(0.1):
                pass
        except KeyboardInterrupt:
            pass
        raise
    if "error" in result:
        error = result.pop("error")
        try:
            raise error
        finally:
            del error
    return result["value"]


def _summary(who: str, d: Mapping[str, Any], reporter: Reporter, store: str) -> "IngestSummary":
    """The IngestSummary of a finished ingest; its warnings raised as RuntimeWarning (seen from the caller's line)."""
    summary = IngestSummary(**d)
    if summary.samples_total and summary.samples_present == summary.samples_total:
        reporter.nothing_to_do(summary.samples_total, store)
    for w in summary.warnings:
        warnings.warn(f"patchstore.{who}: {w}", RuntimeWarning, stacklevel=3)
    return summary


def _shard_arg(shard: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """(i, n) checked (0 <= i < n), or (0, 0) for None (no sharding)."""
    if shard is None:
        return (0, 0)
    try:
        i, n = shard
        if isinstance(i, bool) or isinstance(n, bool):  # operator.index takes True as 1
            raise TypeError
        i, n = operator.index(i), operator.index(n)
    except (TypeError, ValueError):
        raise TypeError(f"shard must be a pair of ints (i, n), not {shard!r}") from None
    if not 0 < n <= (1 << 20):
        raise ValueError(f"shard={shard!r}: the shard count n must be 1..{1 << 20}")
    if not 0 <= i < n:
        raise ValueError(f"shard={shard!r}: the shard index i must be 0..{n - 1} (shards are numbered from 0)")
    return (i, n)


def ingest_images(
    store: PathLike,
    manifest: Optional[PathLike] = None,
    root: Optional[PathLike] = None,
    fields: Union[Mapping[str, str], Iterable[Union[str, Tuple[str, str]]], None] = None,
    masks: Iterable[str] = (),
    norm: Optional[Mapping[str, str]] = None,
    threads: int = 0,
    on_error: str = "stop",
    *,
    report: Optional[PathLike] = None,
    batch_bytes: int = 256 << 20,
    batch_samples: int = 256,
    durable: bool = True,
    max_pixels: int = 1 << 28,
    isolate_decoders: bool = True,
    decode_timeout: float = 60.0,
    progress: ProgressArg = None,
    callback: Optional[Callable[[Any], None]] = None,
    shard: Optional[Tuple[int, int]] = None,
    layout: str = "rows",
    tile_size: Optional[int] = None,
    encoding: EncodingArg = "float32",
) -> IngestSummary:
    """Decodes images once into the store at `store` (created if missing).

    Same options as ``patchstore ingest images``. Give either

    * ``manifest``: a CSV file with header ``id,<field>,<field>,...`` whose
      cells are paths relative to the manifest's folder (``path.exr:Z`` picks
      an EXR channel), or
    * ``root`` and ``fields``: a folder and one path template per field, in
      order, e.g. ``{"rgb": "{video}/render/rgb/{frame}.png",
      "mask": "{video}/render/masks/{frame}.png",
      "depth": "{video}/render/depth/{frame}.exr"}``. Files matching the
      first template define the samples; the id joins the placeholder values
      with '/' ("video03/0042").

    masks: fields stored as {0,1} (a field named "mask" always is).
    norm: {field: spec}, spec "none" | "symmetric" | "unit" | "binary" |
    "affine:SCALE,OFFSET", optionally "+clamp:LO,HI", or "range:LO,HI"
    ([LO, HI] linearly onto [-1, 1], clamped outside). Defaults: 8/16-bit
    images to [-1,1] (x/maxval*2-1), masks to {0,1}, float data unchanged.
    threads: decoder threads (0 = all cores).
    on_error: "stop" (default; everything committed before the bad file
    stays) or "skip" (record the failure in `report`, default
    <store>/ingest-errors.tsv, and go on).
    batch_bytes, batch_samples: commit after this many record bytes or
    this many samples, whichever comes first (``--commit-every``).
    durable: fsync each commit (False is faster for scratch stores).
    max_pixels: refuse images declaring more pixels (before decoding).
    isolate_decoders: decode in child processes with a memory limit and a
    watchdog, so a hostile file can neither crash nor stall the ingest
    (False: in this process, as ``--in-process``). decode_timeout: seconds
    one file may take to decode in a child process (``--decode-timeout``).
    shard: (i, n) ingests only shard i (0 <= i < n) of n, the samples whose
    id hashes to i (xxh3_64 of the id bytes mod n), into a store of its own
    (``--shard I/N``); run n of these (any processes or machines, at once)
    and read the n stores as one with ``patchstore.open([...])``.
    layout: "rows" (default: row-major records, zero-copy views of whole
    frames, best while the store fits the page cache) or "tiles" (every
    (C,H,W) field in tile_size x tile_size tiles, ``--layout tiles``: a
    random h x w window of a store larger than RAM reads at most
    (1+T/h)(1+T/w) of its bytes). tile_size: a multiple of 8 in 8..4096
    (``--tile-size``); None (default): 64 for a new store (1.56x at most
    for 256x256 windows, in ~5 contiguous ranges per field), a resumed
    store's own; 32 suits windows of 128x128 and smaller.
    encoding: the record dtype (``--encoding``): "float32" (default,
    normalised), "compact" (each field in the smallest type holding its
    source exactly: uint8 for 8-bit images and masks, uint16 for 16-bit,
    float32 for EXR; readers return the same float32, bit for bit), a dict
    {field: "float32" | "compact" | "float16"} (key "*": every other field,
    e.g. {"*": "compact", "depth": "float16"}) or a list of CLI specs
    ["compact", "depth=float16"]. float16 rounds the normalised values to
    nearest (relative error <= 2^-11; beyond 65504 they become inf). A store
    keeps the layout and encoding of its first ingest (resuming with others
    raises ValueError).
    progress: None (default) shows progress on stderr as ``patchstore
    ingest`` does: a bar when stderr is a terminal (tqdm's if tqdm is
    installed), else a plain line every 5 seconds and one at the end;
    False prints nothing; True is the same as None.
    callback: called as callback(p) from the writer thread with the GIL
    held (e.g. to update a notebook widget); p has done, total, failed,
    skipped, bytes, seconds and message (a notice when not empty). If it
    raises, it is not called again and the exception is raised at the end.
    (A callable given as progress= is taken as the callback, with nothing
    printed.)

    Before the first write the ingest reports the store's projected size
    (the first decoded sample's records times the samples) next to this
    machine's RAM, as a notice (printed unless progress=False; also in the
    summary's projected_bytes, ram_bytes and advice). When the store would
    take more than half of RAM it names the options that serve a store read
    from disk: layout="tiles", encoding="compact", and {field: "float16"}
    for float fields where half precision is enough. The environment
    variable PATCHSTORE_ASSUME_RAM_BYTES replaces the RAM figure (e.g. the
    training machine's).

    Running the same ingest again resumes (samples present are skipped). A
    finished ingest seals the store. The GIL is released while it runs.

    Ctrl-C (KeyboardInterrupt, when called from the main thread) stops the
    ingest cleanly: what was decoded is committed, then KeyboardInterrupt
    is raised; the store opens and holds a prefix of the samples, and the
    same call again resumes. A second Ctrl-C raises without waiting for
    that last commit (which still completes before the interpreter exits).

    Raises FileNotFoundError for a missing input, ValueError for bad options,
    OSError for I/O failures (the message names the file and the sample).
    """
    _require_ingest("patchstore.ingest_images")
    src = _sources("ingest_images", store, manifest, root, fields, masks, norm, on_error)
    args = src.call_args
    if on_error != "stop":
        args.append(f"on_error={on_error!r}")
    shard_pair = _shard_arg(shard)
    if shard is not None:
        args.append(f"shard={shard_pair!r}")
    layout, tile_size = _layout_arg(layout, tile_size, "ingest_images")
    if layout == "rows" and tile_size != 0:
        raise ValueError(f"ingest_images: tile_size={tile_size} is for layout='tiles' (the layout is 'rows')")
    encoding_specs = _encoding_specs(encoding, "ingest_images")
    if layout != "rows":
        args.append(f"layout={layout!r}" + (f", tile_size={tile_size}" if tile_size else ""))
    if encoding_specs != ["float32"]:
        args.append(f"encoding={encoding!r}")
    command_line = "patchstore.ingest_images(" + ", ".join(args) + ")"
    batch_samples = operator.index(batch_samples)
    if batch_samples < 1:
        raise ValueError(f"ingest_images: batch_samples must be >= 1, got {batch_samples}")
    from . import _ingest as native

    o = native.ImageIngestOptions()
    src.set_on(o)
    o.layout = layout
    o.tile_size = tile_size
    o.encoding = encoding_specs
    o.threads = int(threads)
    o.skip_errors = on_error == "skip"
    o.report_path = "" if report is None else os.fspath(report)
    o.batch_bytes = int(batch_bytes)
    o.batch_samples = batch_samples
    o.durable = bool(durable)
    o.max_pixels = int(max_pixels)
    o.isolate_decoders = bool(isolate_decoders)
    o.decode_timeout_s = float(decode_timeout)
    o.command_line = command_line
    reporter = Reporter("ingest", "samples", progress, callback)
    o.shard_index, o.shard_count = shard_pair
    d = _run_cancellable(lambda c: native.ingest_images(o, reporter.native(), c), reporter)
    return _summary("ingest_images", d, reporter, o.store)


def _group_specs(groups: Any) -> List[str]:
    """ "GROUP", "GROUP=FIELD", (group, field) pairs or {group: field} -> ["GROUP" | "GROUP=FIELD", ...]."""
    if isinstance(groups, (str, os.PathLike)):
        groups = [groups]
    if isinstance(groups, Mapping):
        items: List[Tuple[str, Optional[str]]] = [(str(g), None if f is None else str(f)) for g, f in groups.items()]
    else:
        items = []
        for g in groups:
            if isinstance(g, str):
                items.append((g, None))
            elif isinstance(g, (tuple, list)) and len(g) == 2:
                items.append((str(g[0]), None if g[1] is None else str(g[1])))
            else:
                raise ValueError(f"ingest_hdf5: a group is 'GROUP', 'GROUP=FIELD' or (GROUP, FIELD), got {g!r}")
    if not items:
        raise ValueError('ingest_hdf5: no groups given (e.g. groups=("MR", "CT", "MASK"))')
    out = []
    for g, f in items:
        if not g or (f is not None and (not f or "=" in g)):
            raise ValueError(f"ingest_hdf5: bad group {g!r}" + ("" if f is None else f" -> field {f!r}"))
        out.append(g if f is None else f"{g}={f}")
    return out


def ingest_hdf5(
    files: Union[PathLike, Iterable[PathLike]],
    store: PathLike,
    groups: Union[str, Mapping[str, str], Iterable[Union[str, Tuple[str, str]]]] = ("MR", "CT", "MASK"),
    slice_axis: int = -1,
    ids: str = "auto",
    masks: Iterable[str] = (),
    norm: Optional[Mapping[str, str]] = None,
    allow_external: bool = False,
    on_error: str = "stop",
    report: Optional[PathLike] = None,
    durable: bool = True,
    progress: ProgressArg = None,
    *,
    batch_bytes: int = 256 << 20,
    callback: Optional[Callable[[Any], None]] = None,
    strict_ids: bool = False,
    slab_bytes: int = 16 << 20,
    chunk_cache_bytes: int = 4 << 20,
    shard: Optional[Tuple[int, int]] = None,
    encoding: EncodingArg = "float32",
    layout: str = "rows",
    tile_size: Optional[int] = None,
) -> IngestSummary:
    """Reads 3D volumes from HDF5 files once into the volume store at `store` (created if missing).

    Same options as ``patchstore ingest hdf5 FILE.h5 ... STORE --group ...``
    (ingest/ingest_hdf5.h). Each file holds one group per modality and in
    each group one 3D dataset per patient (``/MR/patient001``,
    ``/CT/patient001``, ...). Every dataset name present in all the groups
    of a file becomes one volume (a sample); every group becomes a field.
    Each (volume, field) is stored as ONE float32 record of shape (S, H, W),
    slice axis first, so a slice or a stack of neighbouring slices is a
    contiguous zero-copy view (`Store.slice`, `patchstore.torch.SliceDataset`).

    One file per patient is the other layout: where every group path of a
    file names a 3D dataset (``/MR``, ``/CT``, ``/MASK`` at the root), the
    file is one volume whose id is the file stem (``sub-07.h5`` ->
    ``"sub-07"``, whatever `ids` says). Each file is judged on its own; a
    file that is neither layout is an error listing what its root holds.

    files: one path or several. store: the destination directory.
    groups: the groups to read, each "GROUP" or "GROUP=FIELD" (a field named
    after the group unless renamed, e.g. "/data/img=image"), a list of
    (GROUP, FIELD) pairs, or a dict {GROUP: FIELD}.
    slice_axis: the source axis that indexes slices: 0, 1, 2 or negative
    (default -1, the last, for (H, W, S) datasets; 0 for (S, H, W)).
    ids: "auto" (the dataset name, "patient001"; "FILESTEM/name" when several
    files are given), "stem" (always prefixed) or "name" (never).
    masks: fields stored as masks (is_mask, values {0,1} unless `norm` says
    otherwise). A group merely named "MASK" keeps its values (labels).
    norm: {field: spec}, spec "none" (default: values unchanged, a CT keeps
    its HU) | "unit" | "symmetric" (uint8/uint16 sources) | "binary" |
    "affine:SCALE,OFFSET", optionally "+clamp:LO,HI", or "range:LO,HI":
    [LO, HI] linearly onto [-1, 1] (exactly -1, 0, 1 at LO, the midpoint and
    HI), clamped outside, e.g. {"CT": "range:-1024,3000", "MR": "range:0,3000"}.
    allow_external: follow HDF5 external links and read external/virtual
    storage (refused by default: they can make the library read arbitrary
    files).
    on_error: "stop" (default: stop at the first bad volume, keeping what was
    committed) or "skip" (record failures in `report`, default
    <store>/ingest-errors.tsv, and go on; an unreadable file or a missing
    group is one line with an empty id).
    durable: fsync each commit (False is faster for scratch stores).
    shard: (i, n) ingests only shard i of n (``--shard I/N``): the volumes
    whose id hashes to i (xxh3_64 of the id bytes mod n), ids assigned over
    all `files` as without sharding; read the n stores as one with
    ``patchstore.open([...])``.
    progress: None (default) shows progress on stderr (a bar on a terminal,
    tqdm's if installed; plain lines in logs), False prints nothing, as for
    `ingest_images`.
    callback: called as callback(p) with the GIL held after each volume; p
    has done, total (volumes), failed, skipped, bytes, seconds and message
    (a notice when not empty). If it raises, it is not called again and the
    exception is raised at the end. Before the first write the ingest
    reports the store's projected size (from the datasets' headers) next to
    this machine's RAM, and past half of RAM the encodings that make it
    smaller, as `ingest_images` does.
    batch_bytes: commit after this many record bytes.
    encoding: the record dtype per field (``--encoding``), as for
    `ingest_images`: "float32" (default), "compact" (uint8 / uint16
    datasets kept as they are, int8 / int16 as int16, float16 ones with norm
    "none" as float16, others float32; readers return the same float32 bit
    for bit), a dict {field: encoding} (key "*": the others) or a list of
    specs; "float16" per field rounds the normalised values to nearest.
    layout: "rows" only; "tiles" raises ValueError (a slice is read whole,
    one contiguous range of its record, so tiles would not help). tile_size:
    unused.
    slab_bytes: source bytes read per HDF5 hyperslab (whole chunk rows);
    chunk_cache_bytes: the HDF5 chunk cache per dataset. Tuning only.
    strict_ids: with prefixed ids (several files), refuse (ValueError)
    instead of warning when a dataset name is already in the store, or in
    this ingest, under another file prefix (the same patient twice). To add
    new patients to a store, list only the new file or use ids="name".

    Warnings (RuntimeWarning, also in the summary's ``warnings``): a patient
    under several file prefixes, slices much thinner in one direction than
    another slice axis would give (e.g. (S, H, W) data without
    slice_axis=0), an all-zero mask volume.

    Running the same ingest again resumes (volumes present are skipped); a
    finished ingest without failures seals the store. The GIL is released
    while it runs. Ctrl-C (KeyboardInterrupt, from the main thread) stops it
    cleanly as for `ingest_images`: what was committed stays, the same
    call resumes.

    Raises (messages name the file, the group and the dataset):
    FileNotFoundError for a missing input file (checked before anything is
    read when on_error="stop"); KeyError for a group or a patient's dataset
    missing from a file; ValueError for bad options and for unusable
    datasets (a shape that differs between groups, a rank other than 3, an
    empty or non-numeric dataset, an external link without allow_external,
    a compression filter the library lacks); CorruptRecordError (an OSError)
    for a file or chunk HDF5 cannot read; FileExistsError for two datasets
    that would get the same id; OSError for other I/O failures; RuntimeError
    if cancelled.
    """
    _require_ingest("patchstore.ingest_hdf5")
    if on_error not in ("stop", "skip"):
        raise ValueError(f"on_error must be 'stop' or 'skip', not {on_error!r}")
    if ids not in ("auto", "stem", "name"):
        raise ValueError(f"ids must be 'auto', 'stem' or 'name', not {ids!r}")
    if isinstance(files, (str, bytes, os.PathLike)):
        files = [files]
    paths = [os.fsdecode(os.fspath(f)) for f in files]
    if not paths:
        raise ValueError("ingest_hdf5: no HDF5 file given")
    specs = _group_specs(groups)
    axis = int(slice_axis)
    masks = [masks] if isinstance(masks, str) else [str(m) for m in masks]
    norm = {str(k): str(v) for k, v in dict(norm or {}).items()}
    if on_error == "stop":
        for p in paths:
            if not os.path.exists(p):
                raise FileNotFoundError(f"opening HDF5 file '{p}': no such file")
    args = [repr(paths if len(paths) > 1 else paths[0]), repr(os.fspath(store)), f"groups={specs!r}"]
    if axis != -1:
        args.append(f"slice_axis={axis}")
    if ids != "auto":
        args.append(f"ids={ids!r}")
    if masks:
        args.append(f"masks={masks!r}")
    if norm:
        args.append(f"norm={norm!r}")
    if allow_external:
        args.append("allow_external=True")
    if on_error != "stop":
        args.append(f"on_error={on_error!r}")
    shard_pair = _shard_arg(shard)
    if shard is not None:
        args.append(f"shard={shard_pair!r}")
    layout, tile_size = _layout_arg(layout, tile_size, "ingest_hdf5")
    encoding_specs = _encoding_specs(encoding, "ingest_hdf5")
    if encoding_specs != ["float32"]:
        args.append(f"encoding={encoding!r}")
    command_line = "patchstore.ingest_hdf5(" + ", ".join(args) + ")"
    from . import _ingest as native

    o = native.Hdf5IngestOptions()
    o.files = paths
    o.store = os.fspath(store)
    o.groups = specs
    o.slice_axis = axis
    o.ids = ids
    o.strict_ids = bool(strict_ids)
    o.mask_fields = masks
    o.norm = norm
    o.allow_external = bool(allow_external)
    o.encoding = encoding_specs
    o.layout = layout
    o.tile_size = tile_size
    o.skip_errors = on_error == "skip"
    o.report_path = "" if report is None else os.fspath(report)
    o.batch_bytes = int(batch_bytes)
    o.slab_bytes = int(slab_bytes)
    o.chunk_cache_bytes = int(chunk_cache_bytes)
    o.durable = bool(durable)
    o.command_line = command_line
    reporter = Reporter("ingest hdf5", "volumes", progress, callback)
    o.shard_index, o.shard_count = shard_pair
    d = _run_cancellable(lambda c: native.ingest_hdf5(o, reporter.native(), c), reporter)
    return _summary("ingest_hdf5", d, reporter, o.store)
