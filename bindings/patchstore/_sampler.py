"""patchstore.PatchSampler: whole batches of random windows, gathered in C++.

A thin layer over ``patchstore._patchstore.Sampler`` (the C++
``patchstore::PatchSampler``, reader/sampler.h): argument checks, fork
handling and pickling, ``out`` buffers (NumPy arrays or torch tensors), and
the reuse of returned buffers.
"""

from __future__ import annotations

import collections.abc
import operator
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union, overload

import numpy as np

from . import _patchstore as _C
from . import _sampler_options as _so
from ._config import UNSET, SamplerConfig, positional_options, resolve_config
from ._sampler_options import _best_window, _min_valid_note, _position, _warn_skipped, public_options, to_native
from ._store import Store, _decode_id, _writable_buffer, reader_of, register_layer

__all__ = ["PatchSampler", "Window", "Windows"]

PathLike = Union[str, "os.PathLike[str]"]


# The functional form: the class form's field `index` is reported as an incompatible override of tuple.index.
Window = NamedTuple("Window", [("index", int), ("id", str), ("y", int), ("x", int), ("flip", int), ("rot", int),
                               ("positive", bool)])
Window.__doc__ = """One window: where it was cut and how it was transformed.

    ``index``: the sample index in the store; ``id``: the sample id; ``y``,
    ``x``: the top-left corner in the frame. ``flip`` bit 0: rows reversed
    (vertical flip, ``np.flip(w, -2)``), bit 1: columns reversed
    (``np.flip(w, -1)``); ``rot``: quarter turns, the patch served is
    ``np.rot90(flipped, rot, axes=(-2, -1))``. ``positive``: drawn from
    the windows that satisfy ``require``/``min_valid`` (always True
    without ``positive_fraction``).
    """


class Windows:
    """The windows of one batch, as arrays (and as `Window` items when indexed).

    ``index``, ``y``, ``x``: int64 arrays; ``flip``, ``rot``: uint8;
    ``positive``: bool; ``ids``: the sample ids (list of str).
    ``array``: the raw (n, 6) int64 rows (index, y, x, flip, rot, positive).

    A sequence of `Window` (a registered ``collections.abc.Sequence``:
    ``index`` is the array above, not ``Sequence.index(value)``, so the
    class does not inherit Sequence's methods).
    """

    __slots__ = ("array", "_store", "_ids")

    def __init__(self, array: np.ndarray, store: Store) -> None:
        self.array = array
        self._store = store
        self._ids: Optional[List[str]] = None

    @property
    def index(self) -> np.ndarray:
        return self.array[:, 0]

    @property
    def y(self) -> np.ndarray:
        return self.array[:, 1]

    @property
    def x(self) -> np.ndarray:
        return self.array[:, 2]

    @property
    def flip(self) -> np.ndarray:
        return self.array[:, 3].astype(np.uint8)

    @property
    def rot(self) -> np.ndarray:
        return self.array[:, 4].astype(np.uint8)

    @property
    def positive(self) -> np.ndarray:
        return np.asarray(self.array[:, 5] != 0)

    @property
    def ids(self) -> List[str]:
        if self._ids is None:
            r = reader_of(self._store)
            self._ids = [_decode_id(r.id(int(i))) for i in self.array[:, 0]]
        return list(self._ids)

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @overload
    def __getitem__(self, i: int) -> Window: ...

    @overload
    def __getitem__(self, i: slice) -> List[Window]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Window, List[Window]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        row = self.array[operator.index(i)]
        s = int(row[0])
        return Window(s, _decode_id(reader_of(self._store).id(s)), int(row[1]), int(row[2]), int(row[3]), int(row[4]),
                      bool(row[5]))

    def __iter__(self) -> Iterator[Window]:
        return (self[i] for i in range(len(self)))

    def count(self, value: object) -> int:
        return sum(1 for w in self if w is value or w == value)

    def __repr__(self) -> str:
        head = ", ".join(f"({w.id!r}, y={w.y}, x={w.x}, flip={w.flip}, rot={w.rot})" for w in self[:3])
        return f"<patchstore.Windows [{head}{', ...' if len(self) > 3 else ''}] ({len(self)} windows)>"


collections.abc.Sequence.register(Windows)


def _as_target(obj: Any, context: str, what: str) -> Any:
    """A buffer-protocol object writing into `obj` (torch tensors via .numpy(), which shares memory)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise ValueError(f"{context}: {what} must be a CPU tensor (got device '{obj.device}')")
        if obj.dtype != torch.float32:
            raise ValueError(f"{context}: {what} must be float32 (got {obj.dtype})")
        if not obj.is_contiguous():
            raise ValueError(f"{context}: {what} must be contiguous")
        return obj.detach().numpy()  # shares memory, pinned or not
    if isinstance(obj, np.ndarray) and not obj.flags.writeable:
        raise ValueError(f"{context}: {what} is read-only")
    return obj


def _refs(arrays: Mapping[str, np.ndarray]) -> List[int]:
    return [sys.getrefcount(a) for a in arrays.values()]


class _Recycler:
    """Output arrays for batch(out=None), reused only once the caller has let go of them.

    A set of arrays handed out is reused when nothing outside this pool
    refers to any of its arrays any more (no variable, dict, view, torch
    tensor from torch.from_numpy, memoryview...): its reference counts are
    back to what they were when the pool made it. So a returned batch is
    never overwritten while you can still see it, and a loop that drops each
    batch before the next (or the one after) allocates, and first-touches,
    its memory only once. At most `keep` sets are kept.
    """

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep
        self.sets: List[Tuple[int, Dict[str, np.ndarray], List[int]]] = []
        self.lock = threading.Lock()

    def take(self, n: int, shapes: Mapping[str, Tuple[int, ...]]) -> Dict[str, np.ndarray]:
        """A new dict of free arrays (the dict itself marks them taken before the lock is released)."""
        with self.lock:
            for entry in self.sets:
                if entry[0] == n and _refs(entry[1]) == entry[2]:
                    return dict(entry[1])
            d = {f: np.empty((n,) + tuple(s), dtype=np.float32) for f, s in shapes.items()}
            self.sets.append((n, d, _refs(d)))
            if len(self.sets) > self.keep:
                self.sets.pop(0)  # forgotten by the pool, still valid for whoever holds it
            return dict(d)

    def clear(self) -> None:
        self.sets = []


# The options PatchSampler took by position before SamplerConfig (after store, fields, patch_size).
_POSITIONAL = ("patches_per_sample", "require", "min_valid", "positive_fraction", "seed", "rank", "world_size",
               "num_threads")


class PatchSampler:
    """Batches of random windows from an image store, gathered in C++ (patchstore::PatchSampler).

    Each epoch visits every eligible sample once, in a permutation that
    depends on (seed, epoch), and cuts ``patches_per_sample`` (k) windows of
    ``patch_size`` (P x P, or (h, w)) from each visit: an epoch holds
    ``len(sampler)`` windows on this rank. `batch` copies the next n of
    them, for every field, straight from the store's memory map into
    contiguous float32 (n, C, P, P) arrays, on ``num_threads`` threads with the
    GIL released; batches continue into the next epoch when one ends.

    store: a store path or a `patchstore.Store`. fields: the fields to
    gather, e.g. ``["rgb", "mask", "depth"]``. Options: ``config=``
    `patchstore.SamplerConfig` and/or its fields as keywords (the
    defaults are SamplerConfig's, from C++; ``patch_size`` and the older
    positional order ``patches_per_sample, require, min_valid,
    positive_fraction, seed, rank, world_size, num_threads`` still work).

    require: a 1-channel mask field (or None for uniform windows). Every
    window then holds at least ``min_valid`` valid (non-zero, non-NaN) mask
    pixels, or for ``0 < min_valid < 1`` that fraction of the window, and is
    drawn uniformly over all such windows of its sample (exactly: uniform
    candidates checked by their own mask pixels, then, if 16 fail, a draw
    from the windows found with the mask's summed-area table).
    ``positive_fraction``: draw each window from the qualifying set with
    that probability and from the others otherwise (a sample lacking one
    kind uses the other).

    policy: "auto" (the above, from require / positive_fraction), or by name
    "uniform", "min_valid", "positive_fraction". ids: only these samples
    (sample ids or store indices), e.g. a train/val split.

    Samples without an admissible window (an empty mask, or smaller than the
    window) are skipped and counted: `skipped`, `skipped_ids`,
    and one RuntimeWarning when the sampler is built (the same text from
    every loader).

    Determinism: the permutation depends on (seed, epoch) only, window j of
    the visit at global position g on (seed, epoch, g, j) only, so batches do
    not depend on num_threads or on how the windows are split into batches.

    Sharding: ``rank``/``world_size`` split every epoch as
    ``torch.utils.data.DistributedSampler`` does (drop_last=False): rank r
    takes global positions r, r + world_size, ...; the permutation is padded
    by repeating its start to a multiple of world_size, so shards are equal,
    disjoint up to that padding, and together cover every eligible sample.

    flip / rot90: random flips (each axis with probability 1/2) and quarter
    turns, applied inside the copy; `Window` says which.

    prefetch (on by default: ``SamplerConfig().prefetch`` batches): after each `batch`, the
    byte ranges of the windows of the next ``prefetch`` batches (of the same
    n; they are known in advance) are kept requested from the disk (madvise
    WILLNEED), and the masks of the batch after, so a store that is not in
    the page cache is read with many requests in flight while you use the
    batch. It holds no memory of its own (page cache only: ``prefetch``
    batches of window bytes ahead) and changes no window. A number of
    batches (1..64) sets the depth; off: ``prefetch=False`` (or 0).

    order: "random" (default: a uniform permutation per epoch) or
    "locality" with ``cache_budget`` (bytes, or "8GB"): for stores larger
    than the page cache, each epoch visits the samples in shuffled blocks of
    storage order whose records fit cache_budget / 2, shuffled inside each
    block (reader/order.h); every sample still once per epoch (across
    ranks), the same eligibility and windows per visit, deterministic in
    (seed, epoch, rank, world_size).

    Returned buffers (``batch(n)`` without ``out``): fresh-looking NumPy
    arrays that are yours; their memory is recycled for a later batch only
    after you have dropped every reference to them (array, view, torch
    tensor from ``torch.from_numpy``...), so a batch you hold is never
    overwritten, and a training loop that keeps one or two batches alive
    allocates (and page-faults) its buffers once. For full control pass
    ``out=`` buffers of your own, e.g. pinned torch tensors.

    Processes: pickles as (store path, options, epoch and position) and
    reopens in the receiving process; used in a forked child it reopens the
    store and rebuilds the C++ sampler, continuing from the same position.
    Threads: ``batch`` is serialised per sampler; ``gather``, ``window`` and
    the windows of a given epoch may be read from any thread.
    """

    def __init__(
        self,
        store: Union[PathLike, Store],
        fields: Union[str, Sequence[str]],
        patch_size: Any = UNSET,
        *positional: Any,
        config: Optional[SamplerConfig] = None,
        _who: str = "patchstore.PatchSampler",
        **options: Any,
    ) -> None:
        self._store = store if isinstance(store, Store) else Store(store)
        options = positional_options(_who, patch_size, positional, _POSITIONAL, options)
        self._config = resolve_config(config, options, _who)
        self._opts = to_native(fields, self._config, _who)
        self._native: Optional[_C.Sampler] = None
        self._pid = -1
        self._position: Tuple[int, int] = (0, 0)
        self._recycler = _Recycler()
        self._last: Optional[Windows] = None
        _warn_skipped(self._s(), _who)  # errors (unknown field, bad sizes) here, not at the first batch

    # -- process handling ---------------------------------------------------------

    def _s(self) -> "_C.Sampler":
        """The C++ sampler of this process (rebuilt after fork or unpickling, at the same position)."""
        s = self._native
        if s is not None and self._pid == os.getpid():
            return s
        # After fork the parent's sampler is dropped unused (its mutex may be
        # held by a thread that does not exist here); self._position mirrors
        # its position as of the last batch.
        self._native = None
        self._recycler = _Recycler()
        s = _C.Sampler(reader_of(self._store), self._opts)
        s.set_position(*self._position)
        self._native, self._pid = s, os.getpid()
        return s

    def __reduce__(
            self) -> Tuple[Callable[..., PatchSampler], Tuple[str, Dict[str, bool], Dict[str, Any], Tuple[int, int]]]:
        position = self._position
        if self._native is not None and self._pid == os.getpid():
            position = self._native.position
        return (_unpickle_sampler, (self._store.path, self._store.options, self.options, position))

    # -- description ----------------------------------------------------------------

    @property
    def store(self) -> Store:
        return self._store

    @property
    def fields(self) -> Tuple[str, ...]:
        return tuple(self._opts.fields)

    @property
    def channels(self) -> Dict[str, int]:
        """{field: channels} of the gathered fields."""
        return dict(zip(self.fields, self._s().channels))

    @property
    def patch_size(self) -> Union[int, Tuple[int, int]]:
        """P for square windows, else (h, w)."""
        h, w = self.patch_shape
        return h if h == w else (h, w)

    @property
    def patch_shape(self) -> Tuple[int, int]:
        """(h, w) of every window."""
        return (self._opts.patch_h or self._opts.patch_size), (self._opts.patch_w or self._opts.patch_size)

    @property
    def patches_per_sample(self) -> int:
        return int(self._opts.patches_per_sample)

    @property
    def options(self) -> Dict[str, Any]:
        """The sampler's fields and options, in the Python spelling (what pickling keeps, with the store path)."""
        return public_options(self._opts)

    @property
    def config(self) -> SamplerConfig:
        """The SamplerConfig this sampler was built with (keywords included)."""
        return self._config

    def shapes(self, n: int) -> Dict[str, Tuple[int, int, int, int]]:
        """{field: (n, C, h, w)}: the shapes batch(n) fills."""
        h, w = self.patch_shape
        return {f: (operator.index(n), c, h, w) for f, c in self.channels.items()}

    def __len__(self) -> int:
        """Windows per epoch on this rank (visits_per_epoch * patches_per_sample)."""
        return int(self._s().windows_per_epoch)

    @property
    def windows_per_epoch(self) -> int:
        return int(self._s().windows_per_epoch)

    @property
    def visits_per_epoch(self) -> int:
        """Sample visits per epoch on this rank: ceil(eligible / world_size)."""
        return int(self._s().visits_per_epoch)

    @property
    def eligible(self) -> int:
        """Samples with at least one admissible window."""
        return int(self._s().eligible_samples)

    @property
    def skipped(self) -> int:
        """Samples without an admissible window (never visited)."""
        return int(self._s().skipped_samples)

    @property
    def candidate_stats(self) -> Dict[str, int]:
        """How this process decided candidate windows of mask-aware draws so far:
        {'by_lists', 'by_blocks', 'by_counting'} (window lists, the mask's block counts, or
        counting the candidate's mask pixels, the only one that reads the mask). The windows
        drawn do not depend on it."""
        return {k: int(v) for k, v in self._s().candidate_stats.items()}

    @property
    def skipped_ids(self) -> List[str]:
        """Ids of the skipped samples (the first 1000)."""
        return [_decode_id(b) for b in self._s().skipped_ids]

    def eligibility(self) -> np.ndarray:
        """A bool array over the store's samples: True where the sample has an admissible window."""
        return np.frombuffer(self._s().eligibility(), dtype=np.uint8).astype(bool)

    def __repr__(self) -> str:
        o = self.options
        return (f"PatchSampler('{self._store.path}', fields={list(o['fields'])}, patch_size={o['patch_size']}, "
                f"patches_per_sample={o['patches_per_sample']}, require={o['require']!r}, seed={o['seed']}, "
                f"rank={o['rank']}, world_size={o['world_size']}, epoch={self.epoch}, "
                f"windows_per_epoch={len(self)}, skipped={self.skipped})")

    # -- position ------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next batch starts in."""
        return int(self._s().position[0])

    @property
    def cursor(self) -> int:
        """The window of that epoch the next batch starts at."""
        return int(self._s().position[1])

    def set_epoch(self, epoch: int) -> None:
        """Continue from the start of `epoch` (>= 0)."""
        e = _position(epoch, "epoch")
        self._s().set_position(e, 0)
        self._position = (e, 0)

    # -- batches -------------------------------------------------------------------

    def _context(self, method: str) -> str:
        return f"PatchSampler.{method} on '{self._store.path}'"

    def _targets(self, out: Any, n: int, method: str) -> List[Any]:
        if not isinstance(out, Mapping):
            raise ValueError(f"{self._context(method)}: out must be a dict {{field: buffer}} for fields "
                             f"{list(self.fields)}, got {type(out).__name__}")
        extra = [k for k in out if k not in self.fields]
        if extra:
            raise ValueError(f"{self._context(method)}: out has keys {extra} that are not gathered fields "
                             f"{list(self.fields)}")
        targets = []
        for f in self.fields:
            if f not in out:
                raise ValueError(f"{self._context(method)}: out lacks field '{f}' (needs {list(self.fields)})")
            targets.append(_as_target(out[f], self._context(method), f"out['{f}']"))
        return targets

    def _no_windows(self, s: "_C.Sampler", method: str) -> None:
        if s.windows_per_epoch == 0:
            h, w = self.patch_shape
            raise ValueError(f"{self._context(method)}: no sample has an admissible {h}x"
                             f"{w} window ({s.skipped_samples} of {s.considered_samples} samples "
                             f"skipped{', require=' + repr(self._opts.require) if self._opts.require else ''}"
                             f"{self._min_valid_note() if self._opts.require else ''})")

    def _min_valid_note(self) -> str:
        o = self._opts
        return (_min_valid_note(o.min_valid, self.patch_size)
                + _best_window(self._store, o.require, self.patch_size))

    def batch(self, n: int, out: Optional[Mapping[str, Any]] = None, *, return_windows: bool = False) -> Any:
        """The next `n` windows: {field: float32 (n, C, P, P)}, continuing into the next epoch.

        out: None, or {field: buffer} for every gathered field: writable,
        C-contiguous float32 NumPy arrays or CPU torch tensors (pinned or not)
        of shape (n, C, P, P). The windows are written there and the same
        objects are returned. ValueError names a buffer that does not fit.
        return_windows: also return the `Windows` of the batch (they
        are kept as `last_windows` anyway).
        """
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"{self._context('batch')}: n must be >= 0, got {n}")
        s = self._s()
        if n > 0:
            self._no_windows(s, "batch")
            _so.check_batch_end(self._context("batch"), s.position, n, s.windows_per_epoch)
        if out is None:
            result: Dict[str, Any] = self._recycler.take(n, {f: s[1:] for f, s in self.shapes(n).items()})
            targets = [result[f] for f in self.fields]
        else:
            targets = self._targets(out, n, "batch")
            result = {f: out[f] for f in self.fields}
        wins = np.empty((n, 6), dtype=np.int64)
        self._position = s.next(n, targets, wins)
        del targets
        self._last = Windows(wins, self._store)
        return (result, self._last) if return_windows else result

    @property
    def last_windows(self) -> Optional[Windows]:
        """The windows of the last batch() (None before the first)."""
        return self._last

    def gather(self, epoch: int, first: int, n: int, out: Optional[Mapping[str, Any]] = None, *,
               return_windows: bool = False) -> Any:
        """Windows [first, first + n) of `epoch` on this rank, statelessly (the cursor does not move).

        Window w of an epoch is window w % k of visit w // k. out as in batch();
        None allocates new arrays.
        """
        n, first, epoch = operator.index(n), _position(first, "first"), _position(epoch, "epoch")
        if epoch < 0 or first < 0 or n < 0:
            raise ValueError(f"{self._context('gather')}: epoch, first and n must be >= 0")
        s = self._s()
        if out is None:
            result: Dict[str, Any] = {f: np.empty(shape, np.float32) for f, shape in self.shapes(n).items()}
            targets = [result[f] for f in self.fields]
        else:
            targets = self._targets(out, n, "gather")
            result = {f: out[f] for f in self.fields}
        wins = np.empty((n, 6), dtype=np.int64)
        s.gather(epoch, first, n, targets, wins)
        return (result, Windows(wins, self._store)) if return_windows else result

    def window(self, epoch: int, position: int, j: int = 0) -> Window:
        """Window j of the visit at rank-local `position` of `epoch` (what batch() serves there)."""
        epoch, position, j = _position(epoch, "epoch"), _position(position, "position"), operator.index(j)
        if epoch < 0 or position < 0:
            raise ValueError(f"{self._context('window')}: epoch and position must be >= 0")
        s = self._s()
        self._no_windows(s, "window")
        sample, y, x, flip, rot, positive = s.window_at(epoch, position, j)
        return Window(sample, _decode_id(reader_of(self._store).id(sample)), y, x, flip, rot, positive)

    def windows(self, epoch: int) -> Windows:
        """All windows of `epoch` on this rank, in order (no pixels copied)."""
        epoch = _position(epoch, "epoch")
        s = self._s()
        n = int(s.windows_per_epoch)
        k = self.patches_per_sample
        rows = np.empty((n, 6), dtype=np.int64)
        for w in range(n):
            rows[w] = s.window_at(epoch, w // k, w % k)
        return Windows(rows, self._store)

    def gather_windows(self, windows: Union[Windows, np.ndarray], out: Optional[Mapping[str, Any]] = None) -> Any:
        """Copies the given windows (a Windows, or int64 (n, 6) rows) of every field; out as in batch()."""
        rows = windows.array if isinstance(windows, Windows) else np.ascontiguousarray(windows, dtype=np.int64)
        n = rows.shape[0]
        s = self._s()
        if out is None:
            result: Dict[str, Any] = {f: np.empty(shape, np.float32) for f, shape in self.shapes(n).items()}
            targets = [result[f] for f in self.fields]
        else:
            targets = self._targets(out, n, "gather_windows")
            result = {f: out[f] for f in self.fields}
        s.gather_windows(rows, targets)
        return result


def _unpickle_sampler(path: str, store_options: Dict[str, bool], options: Dict[str, Any],
                      position: Tuple[int, int]) -> PatchSampler:
    self = PatchSampler.__new__(PatchSampler)
    self._store = Store(path, _lazy=True, **store_options)
    options = dict(options)
    fields = options.pop("fields")
    self._config = SamplerConfig(**options)
    self._opts = to_native(fields, self._config, "patchstore.PatchSampler")
    self._native = None
    self._pid = -1
    epoch, cursor = position
    self._position = (epoch, cursor)
    self._recycler = _Recycler()
    self._last = None
    return self


def read_patches(self: Store, keys: Any, field: str, ys: Any, xs: Any, h: int, w: int, out: Any = None, *,
                 num_threads: int = 1) -> Any:
    """Copies N windows of one field into a contiguous (N,C,h,w) float32 batch.

    keys: sample ids or indices (a sequence, an integer array, or one key
    used for every window); ys, xs: top-left corners (sequences or scalars,
    broadcast against each other). The gather runs in C++ with the GIL
    released, on `num_threads` threads (0 = all cores).

    out: where to write. None allocates a NumPy array. Otherwise any
    writable C-contiguous float32 buffer of N*C*h*w elements (a NumPy array,
    anything with the buffer protocol) or a contiguous float32 CPU torch
    tensor, pinned or not. Returns `out` (or the new array).

    Every window is checked before anything is copied (IndexError when one
    leaves its record, KeyError for an unknown key or field).
    """
    r = reader_of(self)
    idx = self._indices(r, keys)
    ya = np.asarray(ys, dtype=np.int64).reshape(-1)
    xa = np.asarray(xs, dtype=np.int64).reshape(-1)
    try:
        idx, ya, xa = (np.ascontiguousarray(a) for a in np.broadcast_arrays(idx, ya, xa))
    except ValueError:
        raise ValueError(f"read_patches on '{self._path}': {idx.size} keys, {ya.size} ys and {xa.size} xs "
                         f"do not broadcast") from None
    if out is None:
        n = idx.shape[0]
        c = r.summary(int(idx[0]), field)["shape"][0] if n else self.fields[field].channels
        out = np.empty((n, c, int(h), int(w)), dtype=np.float32)
        target = out
    else:
        target = _writable_buffer(out, self._path)
    r.copy_patches(idx, field, ya, xa, int(h), int(w), target, int(num_threads))
    return out


register_layer("read_patches", read_patches)  # Store.read_patches
