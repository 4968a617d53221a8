"""patchstore.copy: the command line's ``patchstore copy``, from Python (ingest/convert.h).

The compiled work is patchstore::CopyStore in the ingest module (imported on
first use); it runs with the GIL released.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from ._ingest_api import _require_ingest, _run_cancellable
from ._ingest_args import EncodingArg, PathLike, _encoding_specs, _layout_arg
from ._progress import ProgressArg, Reporter

__all__ = ["copy", "CopySummary"]


@dataclass(frozen=True)
class CopySummary:
    """What a copy did (patchstore::CopySummary)."""

    converted: bool  #: re-laid out / re-encoded from the records (False: a compacted copy of the bytes)
    samples: int  #: samples verified in the copy
    records: int  #: records verified (mask block counts included)
    src_bytes: int  #: data.mdb of the source
    dst_bytes: int  #: data.mdb of the copy
    seconds: float


def copy(
    src: PathLike,
    dst: PathLike,
    *,
    layout: Optional[str] = None,
    tile_size: Optional[int] = None,
    encoding: Union[EncodingArg, None] = None,
    threads: int = 0,
    durable: bool = True,
    progress: ProgressArg = None,
    callback: Optional[Callable[[Any], None]] = None,
) -> CopySummary:
    """Copies the store `src` to the new directory `dst`, verified, as ``patchstore copy SRC DST`` does.

    Without layout, tile_size and encoding: a compacted copy of the store's
    bytes (e.g. onto node-local disk). With them, a copy re-laid out and
    re-encoded from the records, without the sources (``--layout``,
    ``--tile-size``, ``--encoding``): every record is read (its checksum
    checked), brought to the float32 values readers return and encoded again
    by the ingest's encoder, with every sample's id and metadata, the store's
    attributes, mask block counts and sample index; sealed when the source
    is. Reads from the copy equal reads from `src` bit for bit for the exact
    encodings ("float32", "compact"); {field: "float16"} rounds to nearest as
    ingest does.

    layout: None (each field keeps its own), "rows" or "tiles" (image
    stores only; a volume store raises ValueError). tile_size: with
    layout="tiles", a multiple of 8 in 8..4096; None: the source's tile edge
    when it is tiled, else the ingest default. encoding: as for
    `ingest_images`: "float32" | "compact" for every field, a dict
    {field: "float32" | "compact" | "float16"} (key "*": the other fields)
    or a list of specs; fields that no spec names keep their dtype.
    threads: converter threads (0: all cores). durable: fsync each commit.

    The copy is written into a temporary folder next to `dst`, verified
    there and renamed to `dst` only when complete: a failed, interrupted
    (Ctrl-C: KeyboardInterrupt) or killed copy leaves no `dst`.

    progress: None (default) shows the conversion's and the verification's
    progress on stderr as the command line does, False prints nothing.
    callback: called as callback(p) with the conversion's progress reports
    (p.done, p.total samples; p.message a notice when not empty).

    Raises FileExistsError when `dst` exists, FileNotFoundError when `src`
    is not a store, ValueError for bad options and for a conversion that
    would change a value (naming sample, field and value, and the encoding
    that keeps the field as it is), CorruptRecordError (an OSError) for a
    damaged source record or a copy that fails verification (the problems
    listed), OSError for I/O failures.
    """
    _require_ingest("patchstore.copy")
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    args = [repr(src_s), repr(dst_s)]
    layout_s, tile = "", 0
    if layout is not None:
        layout_s, tile = _layout_arg(layout, tile_size, "copy")
        if layout_s == "rows" and tile:
            raise ValueError(f"copy: tile_size={tile} is for layout='tiles' (the layout is 'rows')")
        args.append(f"layout={layout_s!r}" + (f", tile_size={tile}" if tile else ""))
    elif tile_size is not None:
        raise ValueError(f"copy: tile_size={tile_size} is for layout='tiles' (give layout='tiles')")
    specs = [] if encoding is None else _encoding_specs(encoding, "copy")
    if encoding is not None:
        args.append(f"encoding={encoding!r}")
    threads = int(threads)
    if threads < 0:
        raise ValueError(f"copy: threads must be 0 (all cores) or positive, got {threads}")
    reporter = Reporter("copy", "samples", progress, callback)
    verifier = Reporter("verify", "records", progress, None)
    from . import _ingest as native

    command_line = "patchstore.copy(" + ", ".join(args) + ")" if layout is not None or specs else ""

    def run(cancel: Any) -> Any:
        try:
            return native.copy(src_s, dst_s, layout_s, tile, specs, threads, bool(durable), command_line,
                               reporter.native(), verifier.native(), cancel)
        finally:
            verifier.close()

    d = _run_cancellable(run, reporter)
    return CopySummary(**d)
