"""The options of SliceDataset and the volume montage, one set (reader/slice_sampler.h).

Converts what users pass (a SliceConfig, patchstore/_config.py) into the C++
``patchstore::SliceOptions`` (``_patchstore.SliceOptions``) and back;
SliceOptions::Validate is the only check of the values. No slice is drawn
here: items come from the C++ SliceSampler only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _patchstore as _C
from ._sampler_options import fill_native

if TYPE_CHECKING:  # pragma: no cover
    from ._store import Store


def _ids(o: "_C.SliceOptions", ids: Any, store: Optional["Store"]) -> None:
    """ids: None (every volume) or volume ids (str, bytes) and/or store indices (int), in that order of
    service -> samples (with a store), or ids and samples."""
    if ids is None:
        return
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"ids must be a list of volume ids, not the single string {ids!r} (did you mean "
                        f"ids=[{ids!r}]?)")
    values = list(ids)
    if not values:
        raise ValueError("ids=[] selects no volume (the dataset would be empty); give ids=None for all volumes")
    if store is not None:  # resolved here, keeping the order of mixed ids and indices
        from ._store import reader_of
        r = reader_of(store)
        o.samples = [int(store._index(r, k)) for k in values]
        return
    names: List[str] = []
    indices: List[int] = []
    for v in values:
        if isinstance(v, str):
            names.append(v)
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            if v < 0:
                raise ValueError(f"ids: volume index {v} is negative")
            indices.append(int(v))
        else:
            raise TypeError(f"ids must hold volume ids (str) or indices (int), got {v!r}")
    o.ids, o.samples = names, indices


def _num_threads(o: "_C.SliceOptions", v: Any) -> None:
    """num_threads: 0 means every core."""
    o.num_threads = (os.cpu_count() or 1) if (not isinstance(v, bool) and v == 0) else v


# Python spelling -> C++ value, where they differ (None for "off"). Every other option is set as it is:
# the bound property converts it by its C++ type (context, crop, flip, clamp, output included).
_TO_NATIVE = {
    "require": lambda o, v: setattr(o, "require", "" if v is None else v),
    "positive_fraction": lambda o, v: setattr(o, "positive_fraction", -1.0 if v is None else v),
    "clamp_warn": lambda o, v: setattr(o, "clamp_warn", -1.0 if v is None else v),
    "num_threads": _num_threads,
}


def to_native(fields: Union[str, Sequence[str]], config: Any, what: str,
              store: Optional["Store"] = None) -> "_C.SliceOptions":
    """The C++ options (``_C.SliceOptions``) of `fields` and a SliceConfig, validated in C++.

    With `store`, ids are resolved to store indices here (KeyError for an unknown id). Conversions only: a
    ValueError or TypeError names the caller (`what`) and the option.
    """
    o = _C.SliceOptions()
    fl = [fields] if isinstance(fields, str) else list(fields)
    for f in fl:
        if not isinstance(f, str):
            raise TypeError(f"{what}: field names must be str, got {f!r}")
    o.fields = fl
    converters = dict(_TO_NATIVE, ids=lambda o, v: _ids(o, v, store))
    return fill_native(o, _C.SLICE_OPTIONS, config, converters, what)


def from_native(o: "_C.SliceOptions") -> Dict[str, Any]:
    """{Python keyword: value} of C++ options, in the Python spelling (None for off, ...)."""
    d = {row[0]: getattr(o, row[0]) for row in _C.SLICE_OPTIONS}
    d["require"] = d["require"] or None
    d["positive_fraction"] = None if d["positive_fraction"] < 0 else d["positive_fraction"]
    d["clamp_warn"] = None if d["clamp_warn"] < 0 else d["clamp_warn"]
    d["ids"] = (list(o.ids) + list(o.samples)) or None
    return d


def slice_defaults() -> Dict[str, Any]:
    """The C++ defaults of the slice options, in the Python spelling (SliceConfig's defaults)."""
    return from_native(_C.SliceOptions(fields=["-"]))


def field_clamps(clamp: Any, fields: Sequence[str]) -> Dict[str, Tuple[float, float]]:
    """{field: (lo, hi)} of the served fields from a clamp in the Python spelling (None, (lo, hi) for every
    field, or {field: (lo, hi) or None}); checked already (to_native)."""
    if clamp is None:
        return {}
    if isinstance(clamp, Mapping):
        return {f: (float(v[0]), float(v[1])) for f, v in clamp.items() if v is not None}
    lo, hi = (float(v) for v in clamp)
    return {f: (lo, hi) for f in fields}


def field_contexts(native: "_C.SliceOptions", fields: Sequence[str]) -> Dict[str, int]:
    """{field: slices on each side} of the served fields."""
    return {f: int(native.context_of(f)) for f in fields}


def canonical_context(contexts: Mapping[str, int]) -> Union[int, Dict[str, int]]:
    """One number when every field has the same context (how states recorded it before per-field context),
    else {field: context} for every served field."""
    values = set(contexts.values())
    return int(next(iter(values))) if len(values) == 1 else {f: int(c) for f, c in contexts.items()}
