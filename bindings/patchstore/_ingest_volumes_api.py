"""patchstore.ingest_volumes: NIfTI, MetaImage, NRRD and DICOM volumes through ITK, with their geometry.

The keywords and checks shared with the other ingests (templates, encodings,
shards, progress, cancelling) come from _ingest_api; the work is
patchstore::IngestVolumes (ingest/ingest_volumes.h) in the compiled _ingest
module.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Callable, Iterable, List, Mapping, Optional, Tuple, Union

from ._ingest_api import IngestSummary, _run_cancellable, _shard_arg, _summary
from ._ingest_args import EncodingArg, PathLike, _encoding_specs, _sources
from ._progress import ProgressArg, Reporter

__all__ = ["ingest_volumes"]


def ingest_volumes(
    store: PathLike,
    manifest: Optional[PathLike] = None,
    root: Optional[PathLike] = None,
    fields: Union[Mapping[str, str], Iterable[Union[str, Tuple[str, str]]], None] = None,
    masks: Iterable[str] = (),
    norm: Optional[Mapping[str, str]] = None,
    slice_axis: str = "axial",
    orient: Optional[str] = None,
    spacing: Optional[Tuple[float, float, float]] = None,
    on_error: str = "stop",
    *,
    interpolation: Optional[Mapping[str, str]] = None,
    series: Optional[str] = None,
    volume_index: Optional[int] = None,
    encoding: EncodingArg = "float32",
    threads: int = 0,
    report: Optional[PathLike] = None,
    batch_bytes: int = 256 << 20,
    durable: bool = True,
    max_voxels: int = 1 << 29,
    decode_timeout: float = 600.0,
    decode_memory: int = 0,
    shard: Optional[Tuple[int, int]] = None,
    progress: ProgressArg = None,
    callback: Optional[Callable[[Any], None]] = None,
) -> IngestSummary:
    """Reads medical volumes in their own formats once, through ITK, into the volume store at `store`.

    Same options as ``patchstore ingest volumes`` (ingest/ingest_volumes.h).
    Formats, by the name: NIfTI (.nii, .nii.gz, .hdr/.img), MetaImage (.mha,
    .mhd), NRRD (.nrrd, .nhdr), and a folder holding a DICOM series. Give
    either

    * ``manifest``: a CSV file ``id,<field>,...`` whose cells are files (or
      DICOM folders) relative to the manifest's folder, or
    * ``root`` and ``fields``: a folder and one path template per field, e.g.
      ``{"MR": "{patient}/mr.nii.gz", "CT": "{patient}/ct.nii.gz",
      "MASK": "{patient}/mask.nii.gz"}``; the first field's matches define
      the volumes, ids join the placeholder values with '/'.

    Each (volume, field) becomes one (S, H, W) record, as for
    `ingest_hdf5`; each volume keeps its geometry (spacing, origin,
    direction, the NIfTI qform/sform codes): ``store.volume(id).spacing``,
    ``.origin``, ``.direction``, ``.affine`` (`patchstore.Volume`).

    slice_axis: "axial" (default), "coronal" or "sagittal": the image axis
    closest to that anatomical direction, from each volume's direction
    matrix, becomes S; H and W are the two other axes in SimpleITK's array
    order. A volume its writer stored slices-first is sliced by anatomy,
    never by array position.
    orient: None keeps the source axes; three letters ("RAS", "LPS", ...)
    reorient every volume first (exact: axes permuted and flipped) so that
    its axes i, j, k point that way (nibabel's ``aff2axcodes`` letters).
    spacing: None keeps the grid; (X, Y, Z) mm resamples every volume once at
    ingest (linear for images, whose values become float32; nearest for
    `masks` and fields given "nearest" in `interpolation`); a patient's
    other fields are resampled onto its first field's grid. Without it the
    fields of a patient must share one grid, else ValueError naming the
    difference.
    series: for DICOM folders holding several series, the SeriesInstanceUID
    (or series number) to read (without it such a folder is refused, naming
    its series). volume_index: for 4-D images, the volume to take (without
    it 4-D images are refused).
    masks, norm, encoding, on_error, report, shard, durable, progress,
    callback: as `ingest_hdf5`. threads: decoder processes (0: all
    cores). max_voxels: volumes whose header declares more voxels are
    refused before anything is allocated. Decoding runs in isolated
    processes with a memory limit (decode_memory bytes each; 0: 8 GiB) and a
    time limit (decode_timeout seconds per volume and field), so a hostile
    file fails that volume only.

    Running the same ingest again resumes; a finished ingest without
    failures seals the store. Raises FileNotFoundError for a missing input,
    ValueError for bad options and unusable volumes (two series, a missing
    slice, 4-D, a sheared direction, NaN or zero spacing, fields on
    different grids), CorruptRecordError (an OSError) for a file ITK cannot
    read, OSError for other I/O failures, RuntimeError when this build has
    no ITK.
    """
    src = _sources("ingest_volumes", store, manifest, root, fields, masks, norm, on_error)
    if slice_axis not in ("axial", "coronal", "sagittal"):
        raise ValueError(f"slice_axis must be 'axial', 'coronal' or 'sagittal', not {slice_axis!r}")
    interp = {str(k): str(v) for k, v in dict(interpolation or {}).items()}
    spacing_list: List[float] = []
    if spacing is not None:
        spacing_list = [float(x) for x in spacing]
        if len(spacing_list) != 3:
            raise ValueError(f"spacing takes three numbers (X, Y, Z) mm, got {spacing!r}")
    index = -1 if volume_index is None else operator.index(volume_index)
    if index < -1 or (volume_index is not None and index < 0):
        raise ValueError(f"volume_index must be 0 or more, got {volume_index!r}")
    args = src.call_args
    if slice_axis != "axial":
        args.append(f"slice_axis={slice_axis!r}")
    if orient:
        args.append(f"orient={orient!r}")
    if spacing_list:
        args.append(f"spacing={tuple(spacing_list)!r}")
    shard_pair = _shard_arg(shard)
    if shard is not None:
        args.append(f"shard={shard_pair!r}")
    encoding_specs = _encoding_specs(encoding, "ingest_volumes")
    if encoding_specs != ["float32"]:
        args.append(f"encoding={encoding!r}")
    from . import _ingest as native

    o = native.VolumeIngestOptions()
    src.set_on(o)
    o.slice_axis = slice_axis
    o.orient = orient or ""
    o.spacing = spacing_list
    o.interpolation = interp
    o.series = series or ""
    o.volume_index = index
    o.encoding = encoding_specs
    o.threads = operator.index(threads)
    o.skip_errors = on_error == "skip"
    o.report_path = "" if report is None else os.fspath(report)
    o.batch_bytes = int(batch_bytes)
    o.durable = bool(durable)
    o.max_voxels = int(max_voxels)
    o.decode_timeout_s = float(decode_timeout)
    o.decode_memory_bytes = operator.index(decode_memory)
    o.shard_index, o.shard_count = shard_pair
    o.command_line = "patchstore.ingest_volumes(" + ", ".join(args) + ")"
    if not native.volume_ingest_available():
        raise RuntimeError(
            "patchstore.ingest_volumes: this build has no ITK, which reads NIfTI, MetaImage, NRRD and DICOM "
            "(install libinsighttoolkit5-dev and build again)"
        )
    reporter = Reporter("ingest volumes", "volumes", progress, callback)
    d = _run_cancellable(lambda c: native.ingest_volumes(o, reporter.native(), c), reporter)
    return _summary("ingest_volumes", d, reporter, o.store)
