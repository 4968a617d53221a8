"""patchstore.Store: zero-copy, fork-safe access to a store from Python.

Everything here is a thin layer over the compiled ``patchstore._patchstore``
module: ids are decoded, fork is detected, ``out`` buffers are checked, and
views are wrapped in NumPy arrays without copying.
"""

from __future__ import annotations

import glob
import operator
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, SupportsIndex, Tuple, Union, overload

import numpy as np

from . import _patchstore as _C

CorruptRecordError = _C.CorruptRecordError

#: A sample key: its index (negative counts from the end) or its id.
Key = Union[int, str, bytes]

__all__ = ["Store", "FieldInfo", "Ids", "open", "CorruptRecordError"]

# Store methods implemented by modules above this one: "slice_index" and "volume_class" (_volumes),
# "read_patches" (_sampler) and "montage" (_export_api) register here when imported (patchstore/__init__
# imports them all first), so _store.py imports no sibling and the package has
# no import cycle (tests/python/test_package_layout.py).
_LAYERS: Dict[str, Callable[..., Any]] = {}


def register_layer(name: str, fn: Callable[..., Any]) -> None:
    """Installs the implementation of Store.<name> (called by the module that provides it).

    Store.<name> takes the implementation's docstring, so help() shows it.
    """
    _LAYERS[name] = fn
    method = getattr(Store, name, None)
    if fn.__doc__ and callable(method):
        method.__doc__ = fn.__doc__


def _encode_id(id: Union[str, bytes]) -> bytes:
    """Ids are bytes in the store; str ids are encoded with UTF-8 + surrogateescape."""
    if isinstance(id, bytes):
        return id
    return id.encode("utf-8", "surrogateescape")


def _decode_id(raw: bytes) -> str:
    """Inverse of _encode_id: non-UTF-8 bytes become lone surrogates."""
    return raw.decode("utf-8", "surrogateescape")


class FieldInfo(NamedTuple):
    """What a store holds for one field (from the store metadata).

    ``shape`` is the shape of the first sample's record, e.g. ``(3, 1080, 1920)`` (None for an empty store); samples
    may differ, ``Store.shape(key, field)`` gives one sample's shape. Volume stores: ``shape`` is the (S, H, W)
    shared by every volume, or None when they differ (``Store.shapes(field)`` gives each volume's).

    ``layout`` is the axis order of a record (``"CHW"`` images, ``"SHW"`` volumes), not the rows/tiles
    layout of ``--layout`` and the rest of the manual: that one is ``tile`` (``0``: rows, ``> 0``: tiles).
    """

    name: str
    channels: int
    shape: Optional[Tuple[int, ...]]
    layout: str  #: axis order of a record: "CHW" for images, "SHW" for volumes (rows or tiles: see `tile`)
    norm: str  #: how source values were mapped, e.g. "symmetric/255", "binary", "none"
    source_type: str  #: e.g. "uint8", "float32"
    is_mask: bool
    channel_names: Tuple[str, ...]
    source_format: str  #: "png", "exr", ...
    dtype: str = "float32"  #: element type of the stored records (compact: uint8/uint16/int16); arrays read are float32
    tile: int = 0  #: the storage layout: tile edge of a field stored in tiles (``--layout tiles``), 0 for rows


class Ids(Sequence[str]):
    """The sample ids of a store, in index order, as ``str``.

    Ids are bytes in the store; bytes that are not UTF-8 are decoded with
    ``surrogateescape`` (so ``id.encode("utf-8", "surrogateescape")`` gives the
    stored bytes back, and either form is accepted by ``store[...]``).
    ``id in store.ids`` is O(1).
    """

    __slots__ = ("_store",)

    def __init__(self, store: "Store") -> None:
        self._store = store

    def __len__(self) -> int:
        return len(reader_of(self._store))

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> List[str]: ...
    def __getitem__(self, i: Union[int, slice]) -> Union[str, List[str]]:
        r = reader_of(self._store)
        if isinstance(i, slice):
            return [_decode_id(r.id(j)) for j in range(*i.indices(len(r)))]
        return _decode_id(r.id(self._store._index(r, i)))

    def __iter__(self) -> Iterator[str]:
        return iter([_decode_id(b) for b in reader_of(self._store).ids()])

    def __contains__(self, id: object) -> bool:
        return isinstance(id, (str, bytes)) and id in self._store

    def index(self, id: Union[str, bytes], start: int = 0, stop: Optional[int] = None) -> int:
        i = self._store.index(id)
        if i < start or (stop is not None and i >= stop):
            raise ValueError(f"{id!r} is not in the ids [{start}:{stop}]")
        return i

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(repr(x) for x in self[:5])
        return f"<patchstore.Ids [{head}{', ...' if n > 5 else ''}] ({n} ids)>"


def _array(view: "_C.View") -> np.ndarray:
    """A read-only NumPy array over `view` (no copy; the array's base chain holds `view`)."""
    return np.asarray(view)


class Store:
    """A patchstore store, opened read-only.

    ``Store(path)`` (or `patchstore.open`) opens the store at once, so a
    missing store raises ``FileNotFoundError`` here.

    Access:

    ```python
    len(store)                      # number of samples
    store.ids                       # sequence of str ids
    store.fields                    # {name: FieldInfo}
    store["video03/0042"]           # {field: float32 array (C,H,W)}; also store[i]
    store.get(key, "depth")         # one field
    store.patch(key, "rgb", y, x, h, w)           # (C,h,w) view
    store.read_patches(keys, "rgb", ys, xs, h, w, out=None)   # (N,C,h,w) copy
    # volume stores (patchstore.ingest_hdf5):
    store.volume("patient001")      # {field: (S,H,W) view}
    store.slice("patient001", "MR", k, context=2)   # (5,H,W): a view inside, a copy at the ends
    store.slices                    # SliceIndex: len = total slices, [i] -> (id, k)
    ```

    Arrays from ``store[...]``, ``get`` and ``patch`` are read-only views into the store's memory map (no copy).
    Each keeps the LMDB read transaction it came from alive for as long as it lives, also after ``store.close()`` or
    ``del store``. A store sees the data as it was when opened.

    Processes: a Store pickles as its path and options and reopens lazily in the receiving process (DataLoader
    workers under fork, spawn, forkserver). Used in a forked child, a Store opened in the parent notices the new
    process id and reopens; it never touches the parent's LMDB handles.

    Threads: all reads may run from many threads at once. Errors: unknown id
    or field -> ``KeyError``; index or window outside the data ->
    ``IndexError``; bad argument -> ``ValueError``; OS or LMDB failure ->
    ``OSError`` (``FileNotFoundError`` for a missing store); a record that
    fails validation -> `patchstore.CorruptRecordError` (an ``OSError``).
    Messages name the store, the sample id and the field.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]],
        *,
        verify_checksums: bool = False,
        no_lock: bool = False,
        partial_set: bool = False,
        _lazy: bool = False,
    ) -> None:
        self._path, self._paths = _resolve_stores(path)
        self._options = {"verify_checksums": bool(verify_checksums), "no_lock": bool(no_lock)}
        if partial_set:  # some shards of a set (RankLocalShards); kept by pickling
            self._options["partial_set"] = True
        self._reader: Optional[_C.Reader] = None
        self._pid = -1
        self._closed = False
        self._fields: Optional[Dict[str, FieldInfo]] = None
        self._slices: Any = None  # patchstore.SliceIndex
        if not _lazy:
            self._reopen()

    # -- process handling -------------------------------------------------

    def _reopen(self) -> "_C.Reader":
        if self._closed:
            raise ValueError(f"store '{self._path}' is closed")
        # In a forked child the parent's reader is dropped unused: its C++
        # destructors make no LMDB call outside the process that opened it.
        self._reader = None
        self._fields = None
        o = self._options
        if self._paths is None:
            r = _C.Reader.open(self._path, verify_checksums=o["verify_checksums"], no_lock=o["no_lock"])
        else:
            r = _C.Reader.open_set(self._paths, verify_checksums=o["verify_checksums"], no_lock=o["no_lock"],
                                   partial=o.get("partial_set", False))
        self._reader, self._pid = r, os.getpid()
        return r

    def __reduce__(self) -> Tuple[Callable[[str, Dict[str, bool]], Store], Tuple[str, Dict[str, bool]]]:
        return (_unpickle_store, (self._path, dict(self._options)))

    def close(self) -> None:
        """Drops this object's reader. Arrays handed out stay valid."""
        self._closed = True
        self._reader = None
        self._fields = None
        self._slices = None

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- metadata ---------------------------------------------------------

    @property
    def path(self) -> Any:
        """The absolute path of the store directory; for a set of stores, what was
        given to open it (a directory of shards or a glob, as ``str``; a list, as
        a tuple of absolute paths), so ``patchstore.open(store.path)`` reopens it."""
        return self._path

    @property
    def store_paths(self) -> Tuple[str, ...]:
        """The stores read, in global sample order (one for a single store)."""
        r = reader_of(self)
        return tuple(r.store_path(i) for i in range(r.store_count()))

    def store_of(self, key: Key) -> Tuple[str, int]:
        """(path of the store holding sample `key`, its index in that store)."""
        r = reader_of(self)
        i = self._index(r, key)
        s = r.store_of(i)
        return r.store_path(s), r.local_index(i)

    @property
    def options(self) -> Dict[str, bool]:
        """The options the store was opened with (what pickling keeps)."""
        return dict(self._options)

    @property
    def sealed(self) -> bool:
        """True when the ingest finished (a sealed store is read without LMDB's lock table)."""
        return reader_of(self).sealed

    @property
    def no_lock(self) -> bool:
        """True when this process reads without LMDB's lock table."""
        return reader_of(self).no_lock

    @property
    def kind(self) -> str:
        """"frames" (images) or "volumes"."""
        return reader_of(self).kind

    @property
    def attributes(self) -> Dict[str, str]:
        """Free-form ingest settings recorded in the metadata (e.g. the command line)."""
        return dict(reader_of(self).attributes)

    def __len__(self) -> int:
        return len(reader_of(self))

    @property
    def ids(self) -> Ids:
        """The sample ids (a sequence of str)."""
        return Ids(self)

    @property
    def fields(self) -> Dict[str, FieldInfo]:
        """{field name: FieldInfo}, in field order."""
        r = reader_of(self)
        if self._fields is None:
            out: Dict[str, FieldInfo] = {}
            for f in r.fields():
                shape = None
                if len(r) > 0:
                    try:
                        shape = tuple(r.summary(0, f["name"])["shape"])  # the index: no record read
                    except (KeyError, OSError):  # record missing or damaged for sample 0
                        shape = None
                if shape is not None and f["layout"] == "SHW" and len(r) > 1:
                    shape = _common_shape(r, f["name"], shape)
                names = tuple(x for x in f["channel_names"].split(",") if x)
                out[f["name"]] = FieldInfo(
                    f["name"], int(f["channels"]), shape, f["layout"], f["norm"], f["source_type"],
                    bool(f["is_mask"]), names, f["source_format"], f["dtype"], int(f["tile"]),
                )
            self._fields = out
        return dict(self._fields)

    def __repr__(self) -> str:
        if self._closed:
            return f"<patchstore.Store '{self._path}' (closed)>"
        r = reader_of(self)
        names = ", ".join(f["name"] for f in r.fields())
        return (f"<patchstore.Store '{self._path}' {len(r)} samples, fields [{names}]"
                f"{', sealed' if r.sealed else ''}>")

    # -- lookup -----------------------------------------------------------

    @staticmethod
    def _index(r: "_C.Reader", key: Union[str, bytes, SupportsIndex]) -> int:
        if isinstance(key, (str, bytes)):
            return r.find(_encode_id(key))
        try:
            i = operator.index(key)
        except TypeError:
            raise TypeError(f"sample key must be an int, str or bytes, not {type(key).__name__}") from None
        n = len(r)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {operator.index(key)} out of range [0, {n}) in '{r.path}'")
        return i

    def index(self, key: Key) -> int:
        """The sample index of `key` (an id or an index). KeyError / IndexError when absent."""
        return self._index(reader_of(self), key)

    def __contains__(self, id: object) -> bool:
        if not isinstance(id, (str, bytes)):
            return False
        try:
            reader_of(self).find(_encode_id(id))
            return True
        except KeyError:
            return False

    def __getitem__(self, key: Key) -> Dict[str, np.ndarray]:
        """{field: read-only float32 (C,H,W) or (S,H,W) array}: no copy of float32 rows, else a bit-identical copy."""
        r = reader_of(self)
        views = r.sample(self._index(r, key))
        return {f["name"]: _array(v) for f, v in zip(r.fields(), views)}

    def __iter__(self) -> Iterator[Dict[str, np.ndarray]]:
        """Yields every sample (as ``store[i]``) in index order."""
        for i in range(len(self)):
            yield self[i]

    def get(self, key: Key, field: str) -> np.ndarray:
        """The whole record of one field: a read-only float32 array, (C,H,W) or (S,H,W) (copied as `store[key]`)."""
        r = reader_of(self)
        return _array(r.get(self._index(r, key), field))

    def header(self, key: Key, field: str) -> Dict[str, Any]:
        """The record header: shape, layout, source_type, norm, payload_bytes, checksum."""
        r = reader_of(self)
        return r.header(self._index(r, key), field)

    def shape(self, key: Key, field: str) -> Tuple[int, ...]:
        """The shape of one record, (C,H,W) for images, (S,H,W) for volumes, from the
        store's sample index (no record is read)."""
        r = reader_of(self)
        return tuple(r.summary(self._index(r, key), field)["shape"])

    def shapes(self, field: str) -> Dict[str, Tuple[int, ...]]:
        """{id: shape} of one field over every sample, in index order ((S,H,W) per volume)."""
        r = reader_of(self)
        if field not in self.fields:
            raise KeyError(f"no field '{field}' in '{self._path}' (fields: {', '.join(self.fields)})")
        return {self.ids[i]: tuple(r.summary(i, field)["shape"]) for i in range(len(r))}

    def patch(self, key: Key, field: str, y: int, x: int, h: int, w: int) -> np.ndarray:
        """The (C,h,w) window at (y, x) of one record: a read-only view, no copy.

        IndexError when the window leaves the record, ValueError when h or w < 1.
        """
        r = reader_of(self)
        # Integers only (0.5 or "0" would be truncated or parsed), and within
        # what C++ takes: a window that far out is outside every record.
        y, x, h, w = (operator.index(v) for v in (y, x, h, w))
        if not all(-2 ** 62 <= v < 2 ** 62 for v in (y, x, h, w)):
            raise IndexError(f"patch: window at y={y}, x={x} of {h}x{w} is outside every record")
        return _array(r.patch(self._index(r, key), field, y, x, h, w))

    # -- volumes (stores of kind "volumes") ------------------------------------

    def volume(self, key: Key, field: Optional[str] = None) -> Any:
        """The (S, H, W) volumes of one sample of a volume store: a `Volume`, i.e.
        {field: read-only float32 array} (no copy) with the volume's geometry
        (``.spacing``, ``.origin``, ``.direction``, ``.affine``; None when it has none).

        With `field`, that field's array alone. Each array is a view of the
        record in the store's memory map (slice k is ``vol[k]``, contiguous)
        and keeps the store's read transaction alive while it lives.
        ValueError when the store holds images (kind "frames"), not volumes.
        """
        r = reader_of(self)
        i = self._index(r, key)
        if field is not None:
            return _array(r.volume(i, field))
        return _LAYERS["volume_class"]({f["name"]: _array(r.volume(i, f["name"])) for f in r.fields()}, r.geometry(i))

    def slice(self, key: Key, field: str, k: int, context: int = 0) -> np.ndarray:
        """Slices k-context .. k+context of one volume as a read-only float32 (2*context+1, H, W) array.

        * Entirely inside the volume: a zero-copy view into the store's memory
          map (``np.shares_memory(store.slice(v, f, k, c), store.volume(v, f))``),
          which keeps the read transaction alive while it lives.
        * Crossing either end of the volume: the end slice is repeated
          ("replicate" padding: slice indices are clamped to [0, S-1], so a
          context larger than the volume is fine) into an owned contiguous
          copy (read-only as well; ``np.array(a)`` for a writable one).

        IndexError when k is not in [0, S); ValueError for a negative context
        or a store of images.
        """
        r = reader_of(self)
        k, context = operator.index(k), operator.index(context)
        if not -2 ** 62 <= k < 2 ** 62:
            raise IndexError(f"slice index {k} out of range")
        if not 0 <= context <= 2 ** 20:  # 2*context+1 slices are returned
            raise ValueError(f"slice: context {context} is not in [0, 2**20]")
        return _array(r.slice_stack(self._index(r, key), field, k, context))

    def slice_index(self, ids: Optional[Iterable[Key]] = None) -> Any:
        """A `patchstore.SliceIndex` over the slices of every volume (or of `ids`, in that order)."""
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"slice_index: ids must be a list of volume ids, not the single string {ids!r} "
                            f"(did you mean [{ids!r}]?)")
        return _LAYERS["slice_index"](self, None if ids is None else list(ids))

    @property
    def slices(self) -> Any:
        """The `patchstore.SliceIndex` of all volumes (built once per process, then cached)."""
        if self._slices is None:
            self._slices = self.slice_index()
        return self._slices

    def verify(self, keys: Optional[Iterable[Key]] = None, fields: Optional[Iterable[str]] = None) -> int:
        """Checks the store; raises CorruptRecordError naming every problem found.

        Without ``keys`` and ``fields``: the checks of ``patchstore verify``
        (every record's checksum, each record against its field and the sample
        index, ids unique, every sample complete, field normalisations sound).
        With them: each selected record's checksum and its agreement with its
        field, as a read checks it. Returns the number of field records checked
        (samples x fields; auxiliary records are checked too). The GIL is
        released while checking.
        """
        r = reader_of(self)
        if keys is None and fields is None:
            problems = []
            for path in self._paths or [self._path]:  # each store of a set
                rep = _C.verify_store(path)
                problems += [(path, i, f, m) for i, f, m in rep["problems"]]

            def where(p: str, i: str, f: str) -> str:
                return (f"'{i}' " if i else "") + (f"field '{f}' " if f else "") + f"in '{p}'"

            if problems:
                shown = [f"{where(p, i, f)}: {m}" for p, i, f, m in problems[:20]]
                more = len(problems) - len(shown)
                raise CorruptRecordError(
                    f"{len(problems)} problem(s) found:\n  " + "\n  ".join(shown)
                    + (f"\n  ... and {more} more (run `patchstore verify`)" if more else ""))
            return len(r) * len(r.fields())
        idx = range(len(r)) if keys is None else [self._index(r, k) for k in keys]
        names = [f["name"] for f in r.fields()] if fields is None else list(fields)
        n = 0
        for i in idx:
            for f in names:
                r.verify(i, f)
                n += 1
        return n

    # -- batch copies -------------------------------------------------------

    def _indices(self, r: "_C.Reader", keys: Any) -> np.ndarray:
        if isinstance(keys, (str, bytes, int, np.integer)):
            return np.array([self._index(r, keys)], dtype=np.int64)
        arr = np.asarray(keys) if not isinstance(keys, (list, tuple)) else None
        if arr is not None and arr.dtype.kind in "iu":
            a = arr.astype(np.int64, copy=True).reshape(-1)
            n = len(r)
            neg = a < 0
            if neg.any():
                a[neg] += n
            bad = (a < 0) | (a >= n)
            if bad.any():
                raise IndexError(f"sample index {int(arr.reshape(-1)[np.argmax(bad)])} out of range "
                                 f"[0, {n}) in '{r.path}'")
            return a
        return np.fromiter((self._index(r, k) for k in keys), dtype=np.int64)

    def read_patches(
        self,
        keys: Any,
        field: str,
        ys: Any,
        xs: Any,
        h: int,
        w: int,
        out: Any = None,
        *,
        num_threads: int = 1,
    ) -> Any:
        """Copies N windows of one field into a contiguous (N,C,h,w) float32 batch (see _sampler.read_patches)."""
        return _LAYERS["read_patches"](self, keys, field, ys, xs, h, w, out, num_threads=num_threads)

    # -- looking at what the sampler serves -------------------------------------

    def montage(self, count: int = 64, *args: Any, **options: Any) -> Any:
        """A contact sheet of the windows a loader serves: montage(count, patch_size, field, overlay, seed,
        **options) (documented by _export_api.store_montage); sampling options as
        ``config=SamplerConfig(...)`` or keywords, with the loaders' defaults."""
        return _LAYERS["montage"](self, count, *args, **options)


def _common_shape(r: "_C.Reader", field: str, first: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
    """`first` if every sample's record of `field` has that shape, else None (volumes of different sizes).
    From the store's sample index: no record is read."""
    for i in range(1, len(r)):
        try:
            if tuple(r.summary(i, field)["shape"]) != first:
                return None
        except (KeyError, OSError):
            return None
    return first


def _writable_buffer(out: Any, path: str) -> Any:
    """A buffer-protocol object sharing memory with `out` (torch tensors via .numpy())."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor):
        if out.device.type != "cpu":
            raise ValueError(f"read_patches on '{path}': out must be a CPU tensor (got device '{out.device}')")
        if out.dtype != torch.float32:
            raise ValueError(f"read_patches on '{path}': out must be float32 (got {out.dtype})")
        if not out.is_contiguous():
            raise ValueError(f"read_patches on '{path}': out must be contiguous")
        return out.detach().numpy()  # shares memory, pinned or not
    return out


def reader_of(store: "Store") -> "_C.Reader":
    """The package's internal handle on a Store: its C++ reader (``_patchstore.Reader``) in this process.

    For the package's own modules, which hand it to the compiled samplers and
    kernels (user code reads through `Store`). Opened on first use in
    each process: after fork or unpickling the Store reopens, never touching
    the parent's LMDB handles. ValueError for a closed store.
    """
    r = store._reader
    if r is not None and store._pid == os.getpid():
        return r
    return store._reopen()


_GLOB_CHARS = set("*?[")


def _is_store(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "data.mdb"))


def _resolve_stores(path: Any) -> Tuple[Any, Optional[List[str]]]:
    """(what Store.path reports, the stores of a set or None for one store): a list or tuple of paths is
    a set (put in shard order by the reader), so is a directory that is no store but holds stores, and a
    glob naming no existing path (the stores it matches)."""
    if isinstance(path, (list, tuple)):
        paths = tuple(os.path.abspath(os.fspath(p)) for p in path)
        if not paths:
            raise ValueError("patchstore.open: an empty list of stores")
        return paths, list(paths)
    p = os.path.abspath(os.fspath(path))
    if os.path.isdir(p) and not _is_store(p):
        subs, _skipped, warning = _C.stores_in_folder(p)
        if subs:
            if warning:
                warnings.warn(warning, stacklevel=3)
            return p, list(subs)
    if not os.path.exists(p) and _GLOB_CHARS & set(os.fspath(path)):
        matches = sorted(m for m in glob.glob(p) if _is_store(m))
        if not matches:
            raise FileNotFoundError(f"no store matches '{os.fspath(path)}'")
        return p, matches
    return p, None


def _unpickle_store(path: str, options: Dict[str, bool]) -> Store:
    return Store(path, _lazy=True, **options)
