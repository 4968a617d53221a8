"""Slices of volume stores: SliceIndex, SliceRef, SliceTransform, and the counter-based draws of SliceDataset.

A volume store (written by `patchstore.ingest_hdf5` or ``patchstore
ingest hdf5``) holds one float32 (S, H, W) record per (volume, field). Here
its slices become a flat list of 2D samples (reader/volume.h):

    index = store.slice_index()         # also store.slices
    len(index)                          # slices over all volumes
    index[i]                            # SliceRef(id='patient001', slice=17), O(1)

`SliceTransform` describes the crop, flips and quarter turn that
`patchstore.torch.SliceDataset` applies inside its one copy, and
applies the same thing to NumPy arrays (`SliceTransform.apply`).
"""

from __future__ import annotations

import operator
import os
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union, overload

import numpy as np

from . import _patchstore as _C
from ._store import reader_of, register_layer

if TYPE_CHECKING:  # pragma: no cover
    from ._store import Store

__all__ = ["SliceIndex", "SliceRef", "SliceTransform", "Volume"]


class SliceRef(NamedTuple):
    """One slice of one volume: the sample id and the slice number (0 .. depth-1)."""

    id: str
    slice: int


class SliceTransform(NamedTuple):
    """A crop, flips and a rotation, applied to every slice of a stack (patchstore::SliceTransform).

    In this order, on the last two axes (rows, columns):

    1. crop:   ``a = a[..., y:y+height, x:x+width]`` (height == width == 0: no crop)
    2. flips:  ``np.flip(a, -2)`` if flip_v (upside down), ``np.flip(a, -1)`` if flip_h (mirrored)
    3. rotate: ``np.rot90(a, rot90, axes=(-2, -1))`` (counter-clockwise for 1, as NumPy)
    """

    y: int = 0
    x: int = 0
    height: int = 0
    width: int = 0
    flip_v: bool = False
    flip_h: bool = False
    rot90: int = 0

    def apply(self, a: np.ndarray) -> np.ndarray:
        """The same transform done with NumPy on an array (..., H, W): the reference of the C++ copy."""
        if self.height or self.width:
            a = a[..., self.y:self.y + self.height, self.x:self.x + self.width]
        if self.flip_v:
            a = np.flip(a, -2)
        if self.flip_h:
            a = np.flip(a, -1)
        return np.rot90(a, self.rot90 % 4, axes=(-2, -1))

    def output_size(self, H: int, W: int) -> Tuple[int, int]:
        """The output (rows, columns) for an H x W plane."""
        h = self.height or H
        w = self.width or W
        return (w, h) if self.rot90 % 2 else (h, w)

    @classmethod
    def from_row(cls, row: Any) -> "SliceTransform":
        y, x, h, w, fv, fh, r = (int(v) for v in row)
        return cls(y, x, h, w, bool(fv), bool(fh), r % 4)


# -- counter-based draws --------------------------------------------------------------
#
# One engine: patchstore::DrawSliceTransform (reader/volume.cc), which
# `patchstore montage` uses as well, so a montage shows the very crops,
# flips and turns a SliceDataset serves.


def draw_transforms(seed: int, epoch: int, indices: np.ndarray, heights: np.ndarray, widths: np.ndarray,
                    crop: Optional[Tuple[int, int]], flip: Union[bool, str], rot90: bool) -> np.ndarray:
    """The (n, 7) int64 SliceTransform rows of items `indices` in `epoch` (see SliceDataset).

    key = Hash(seed, epoch, i, "SLIC") (SplitMix64, as the C++ patch
    sampler); then
      crop y = below(Mix(key ^ 1), H - h + 1), x = below(Mix(key ^ 2), W - w + 1)
      flip:  u = Mix(key ^ 3): True -> both axes when u's bit 0 is set (MONAI
             RandFlipd(prob=0.5, spatial_axis=[0, 1])); "independent" -> rows
             flipped when bit 0 is set, columns when bit 1 is set
      rot90: v = Mix(key ^ 4): when bit 0 is set, k = 1 + below(v, 3) (MONAI
             RandRotate90d(prob=0.5, max_k=3)), else 0
    with below(h, n) = ((h >> 32) * n) >> 32. Computed in C++
    (patchstore::DrawSliceTransform).
    """
    idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
    n = idx.shape[0]
    out = np.zeros((n, 7), dtype=np.int64)
    if n == 0:
        return out
    ch, cw = crop if crop is not None else (0, 0)
    mode = "independent" if flip == "independent" else ("both" if flip else "")
    _C.draw_slice_transforms(int(seed), int(epoch), idx, np.ascontiguousarray(heights, dtype=np.int64).reshape(-1),
                             np.ascontiguousarray(widths, dtype=np.int64).reshape(-1), int(ch), int(cw), mode,
                             bool(rot90), out)
    return out


# -- the index ----------------------------------------------------------------------------


class SliceIndex(Sequence[SliceRef]):
    """Every (volume, slice) pair of a volume store as one flat sequence (patchstore::SliceIndex).

    ``len(index)``: the number of slices over all indexed volumes (a Dataset's
    len); ``index[i]``: `SliceRef` ``(id, slice)``, O(1) (a table of
    one volume number per slice plus a prefix sum per volume, built in C++).
    Volumes come in sample order (or the order of ``ids`` given to
    `Store.slice_index`), slices in order.

    ``volumes``: the indexed volume ids; ``first(v)``: the flat index of
    slice 0 of volume v; ``depth(v)``, ``shape(v)``; `locate` gives
    (sample index, slice) arrays for many indices at once.

    Every field of an indexed volume holds an (S, H, W) record of the same
    shape: otherwise ValueError (naming the volume and the field); a store
    of images raises ValueError too.

    Pickles as the store (path and options) and the volume list; rebuilt in
    each process (one header read per record).
    """

    def __init__(self, store: "Store", ids: Optional[Sequence[Union[str, bytes, int]]] = None, *,
                 _lazy: bool = False) -> None:
        self._store = store
        self._samples: Optional[np.ndarray] = None
        if ids is not None:
            if _lazy:
                self._samples = np.asarray(ids, dtype=np.int64)
            else:
                r = reader_of(store)
                self._samples = np.fromiter((store._index(r, k) for k in ids), dtype=np.int64)
        self._native: Optional[Any] = None
        self._pid = -1
        self._hw: Optional[np.ndarray] = None
        if not _lazy:
            self._n()  # errors here

    def _n(self) -> Any:
        ix = self._native
        if ix is not None and self._pid == os.getpid():
            return ix
        ix = _C.SliceIndex(reader_of(self._store), self._samples)
        vc = ix.volume_count
        hw = np.zeros((len(reader_of(self._store)), 2), dtype=np.int64)
        for v in range(vc):
            hw[ix.sample(v)] = (ix.height(v), ix.width(v))
        self._native, self._pid, self._hw = ix, os.getpid(), hw
        return ix

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        ids = None if self._samples is None else [int(s) for s in self._samples]
        return (_unpickle_slice_index, (self._store, ids))

    @property
    def store(self) -> "Store":
        return self._store

    def __len__(self) -> int:
        return len(self._n())

    @property
    def volume_count(self) -> int:
        return int(self._n().volume_count)

    @property
    def volumes(self) -> List[str]:
        """The indexed volume ids, in index order."""
        ix = self._n()
        return [self._store.ids[int(ix.sample(v))] for v in range(ix.volume_count)]

    def sample(self, v: int) -> int:
        """The store's sample index of indexed volume `v`."""
        return int(self._n().sample(operator.index(v)))

    def first(self, v: int) -> int:
        """The flat index of slice 0 of volume `v` (first(volume_count) == len)."""
        return int(self._n().first(operator.index(v)))

    def depth(self, v: int) -> int:
        return int(self._n().depth(operator.index(v)))

    def shape(self, v: int) -> Tuple[int, int, int]:
        """(S, H, W) of volume `v`."""
        ix = self._n()
        v = operator.index(v)
        return int(ix.depth(v)), int(ix.height(v)), int(ix.width(v))

    def select_giving_items(self, crop: Optional[Tuple[int, int]]) -> Tuple[List[str], List[str], str]:
        """(kept ids, skipped ids, text): the volumes that give items with `crop` (h, w), or None for whole
        slices: a slice, and slices no smaller than the crop (patchstore::SelectVolumesGivingItems, the rule
        SliceDataset and ``patchstore montage`` share), and the others, in index order; `text` describes the
        first four skipped ("'p1' (64x64 slices), 'p2' (no slice)")."""
        ch, cw = (0, 0) if crop is None else (int(crop[0]), int(crop[1]))
        kept, skipped, text = self._n().select_giving_items(reader_of(self._store), ch, cw)
        ids = self._store.ids
        return [ids[int(s)] for s in kept], [ids[int(s)] for s in skipped], text

    def _flat(self, i: Any) -> int:
        n = len(self)
        j = operator.index(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"slice index {j} out of range [0, {n}) in '{self._store.path}'")
        return j

    @overload
    def __getitem__(self, i: int) -> SliceRef: ...

    @overload
    def __getitem__(self, i: slice) -> List[SliceRef]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[SliceRef, List[SliceRef]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        sample, k, _ = self._n().at(self._flat(i))
        return SliceRef(self._store.ids[int(sample)], int(k))

    def __iter__(self) -> Iterator[SliceRef]:
        ix = self._n()
        ids = self._store.ids
        for v in range(ix.volume_count):
            sid = ids[int(ix.sample(v))]
            for k in range(int(ix.depth(v))):
                yield SliceRef(sid, k)

    def locate(self, indices: Any) -> Tuple[np.ndarray, np.ndarray]:
        """(sample indices, slices): int64 arrays for an array of flat indices (negative count from the end)."""
        a = self._lookup(indices)
        return a[:, 0].copy(), a[:, 1].copy()

    def _lookup(self, indices: Any) -> np.ndarray:
        """(n, 5) int64 rows (sample, slice, depth, H, W) of flat indices."""
        ix = self._n()
        idx = np.array(indices, dtype=np.int64).reshape(-1)
        n = len(ix)
        idx[idx < 0] += n
        out = np.empty((idx.shape[0], 3), dtype=np.int64)
        ix.lookup(idx, out)
        assert self._hw is not None  # set by self._n()
        hw = self._hw[out[:, 0]]
        return np.concatenate([out, hw], axis=1)

    def __repr__(self) -> str:
        return (f"<patchstore.SliceIndex of '{self._store.path}': {len(self)} slices in "
                f"{self.volume_count} volumes>")


def _unpickle_slice_index(store: "Store", samples: Optional[List[int]]) -> SliceIndex:
    return SliceIndex(store, samples, _lazy=True)  # built on first use, in the receiving process


register_layer("slice_index", SliceIndex)  # Store.slice_index / Store.slices


class Volume(Dict[str, np.ndarray]):
    """One volume of a volume store: ``{field: read-only float32 (S, H, W) array}`` (no copy) and,
    for volumes ingested with their geometry (`patchstore.ingest_volumes`: NIfTI, MetaImage,
    NRRD, DICOM), where its voxels lie in the patient.

    The geometry describes the stored array read as an image whose index axes
    are (x, y, z) = (W, H, S): element ``[s, h, w]`` lies at
    ``origin + direction @ (spacing * (w, h, s))`` in millimetres, in ITK's
    LPS patient coordinates. This is SimpleITK's convention:
    ``sitk.GetImageFromArray(vol["CT"])`` with ``SetSpacing(vol.spacing)``,
    ``SetOrigin(vol.origin)`` and ``SetDirection(vol.direction.ravel())`` is
    the image. ``affine`` maps ``(w, h, s, 1)`` to RAS millimetres, nibabel's
    convention (it equals nibabel's ``img.affine`` of the volume exported with
    ``export(format="nifti")``); ``affine_lps`` is the same map in LPS.

    Every geometry attribute is None for volumes stored without one (HDF5
    ingests, stores written before geometry existed).
    """

    geometry: Optional[Dict[str, Any]]

    def __init__(self, arrays: Dict[str, np.ndarray], geometry: Optional[Dict[str, Any]]) -> None:
        super().__init__(arrays)
        #: The raw geometry (spacing, origin, direction, affine_lps, affine_ras, qform_code, sform_code,
        #: reoriented, resampled, source_spacing, source_size), or None.
        self.geometry = geometry

    @property
    def spacing(self) -> Optional[Tuple[float, float, float]]:
        """Voxel size in mm along x (W), y (H), z (S)."""
        return None if self.geometry is None else tuple(self.geometry["spacing"])

    @property
    def origin(self) -> Optional[Tuple[float, float, float]]:
        """LPS millimetres of element [0, 0, 0]."""
        return None if self.geometry is None else tuple(self.geometry["origin"])

    @property
    def direction(self) -> Optional[np.ndarray]:
        """3x3 direction cosines; column c is axis c (x = W, y = H, z = S) in LPS."""
        return None if self.geometry is None else np.array(self.geometry["direction"], dtype=np.float64).reshape(3, 3)

    @property
    def affine(self) -> Optional[np.ndarray]:
        """4x4 map from (w, h, s, 1) to RAS millimetres (nibabel's convention)."""
        return None if self.geometry is None else np.array(self.geometry["affine_ras"], dtype=np.float64).reshape(4, 4)

    @property
    def affine_lps(self) -> Optional[np.ndarray]:
        """4x4 map from (w, h, s, 1) to LPS millimetres (ITK's convention)."""
        return None if self.geometry is None else np.array(self.geometry["affine_lps"], dtype=np.float64).reshape(4, 4)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k!r}: {tuple(v.shape)}" for k, v in self.items())
        where = "" if self.geometry is None else f", spacing={self.spacing}"
        return f"Volume({{{shapes}}}{where})"


register_layer("volume_class", Volume)  # what Store.volume(key) returns
