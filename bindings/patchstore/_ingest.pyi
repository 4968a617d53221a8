"""Type stubs for patchstore._ingest, the compiled ingest and export (use patchstore.ingest_images /
ingest_hdf5 / export)."""

from typing import Any, Callable, Dict, List, Optional, Tuple

class Progress:
    @property
    def done(self) -> int: ...
    @property
    def total(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def message(self) -> str: ...

class CancelFlag:
    """Polled by an ingest between samples; set() stops it after the last commit."""

    def __init__(self) -> None: ...
    def set(self) -> None: ...
    def is_set(self) -> bool: ...

class ImageIngestOptions:
    """patchstore::ImageIngestOptions (ingest/ingest.h); defaults are the C++ ones."""

    _fields: Tuple[str, ...]
    store: str
    manifest: str
    root: str
    field_templates: List[Tuple[str, str]]
    mask_fields: List[str]
    norm: Dict[str, str]
    layout: str
    tile_size: int
    encoding: List[str]
    threads: int
    skip_errors: bool
    report_path: str
    batch_bytes: int
    batch_samples: int
    durable: bool
    max_pixels: int
    isolate_decoders: bool
    decode_timeout_s: float
    shard_index: int
    shard_count: int
    command_line: str
    def __init__(self) -> None: ...

class Hdf5IngestOptions:
    """patchstore::Hdf5IngestOptions (ingest/ingest_hdf5.h); defaults are the C++ ones."""

    _fields: Tuple[str, ...]
    files: List[str]
    store: str
    groups: List[str]
    slice_axis: int
    ids: str
    strict_ids: bool
    mask_fields: List[str]
    norm: Dict[str, str]
    allow_external: bool
    encoding: List[str]
    layout: str
    tile_size: int
    skip_errors: bool
    report_path: str
    batch_bytes: int
    slab_bytes: int
    chunk_cache_bytes: int
    shard_index: int
    shard_count: int
    durable: bool
    command_line: str
    def __init__(self) -> None: ...

class VolumeIngestOptions:
    """patchstore::VolumeIngestOptions (ingest/ingest_volumes.h); defaults are the C++ ones."""

    _fields: Tuple[str, ...]
    store: str
    manifest: str
    root: str
    field_templates: List[Tuple[str, str]]
    slice_axis: str
    orient: str
    spacing: List[float]
    interpolation: Dict[str, str]
    series: str
    volume_index: int
    mask_fields: List[str]
    norm: Dict[str, str]
    encoding: List[str]
    threads: int
    skip_errors: bool
    report_path: str
    batch_bytes: int
    durable: bool
    max_voxels: int
    decode_timeout_s: float
    decode_memory_bytes: int
    shard_index: int
    shard_count: int
    command_line: str
    def __init__(self) -> None: ...

def ingest_volumes(options: VolumeIngestOptions, progress: Optional[Callable[[Progress], None]] = None,
                   cancel: Optional[CancelFlag] = None) -> Dict[str, Any]: ...
def volume_ingest_available() -> bool: ...
def ingest_images(options: ImageIngestOptions, progress: Optional[Callable[[Progress], None]] = None,
                  cancel: Optional[CancelFlag] = None) -> Dict[str, Any]: ...
def ingest_hdf5(options: Hdf5IngestOptions, progress: Optional[Callable[[Progress], None]] = None,
                cancel: Optional[CancelFlag] = None) -> Dict[str, Any]: ...
def copy(src: str, dst: str, layout: str, tile_size: int, encoding: List[str], threads: int, durable: bool,
         command_line: str, progress: Optional[Callable[[Progress], None]],
         verify_progress: Optional[Callable[[Progress], None]], cancel: Optional[CancelFlag] = None
         ) -> Dict[str, Any]: ...
def render_montage(store: str, count: int, sampler: Any, field: str, overlay: str, require_overlay: bool, epoch: int,
                   has_window: bool, window_lo: float, window_hi: float, tile: int, loader: str = "sampler",
                   with_windows: bool = False) -> Tuple[Any, ...]: ...
def render_volume_montage(store: str, count: int, field: str, overlay: str, slices: Any, epoch: int,
                          has_window: bool, lo: float, hi: float, tile: int, labels: bool
                          ) -> Tuple[int, int, bytearray, Tuple[float, float], List[int], str]: ...
def export(store: str, outdir: str, ids: List[bytes], fields: List[str], format: str, has_window: bool,
           window_lo: float, window_hi: float, progress: Optional[Callable[[Progress], None]],
           axis_order: str = "", window_auto: bool = False) -> Dict[str, Any]: ...
def safe_relative_path(id: bytes) -> bytes: ...
