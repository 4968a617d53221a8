"""The options of the window sampler, one set for every loader (PatchSampler, BatchLoader, PatchDataset, montage).

Converts what users pass (a SamplerConfig, patchstore/_config.py) into the
C++ ``patchstore::SamplerOptions`` (``_patchstore.SamplerOptions``,
reader/sampler.h) and back; the C++ SamplerOptions::Validate is the only
check of the values. Also the skip warning and the notes about min_valid.
No sampling happens here: windows are drawn by the C++ sampler only.
"""

from __future__ import annotations

import math
import operator
import os
import warnings
from typing import Any, Dict, List, Mapping, Sequence, Tuple, TypeVar, Union

import numpy as np

from . import _patchstore as _C

# Epochs, batches, steps and window positions are uint64 in the C++ engine, and
# int64 where they meet NumPy; a value from 2**63 up would wrap (2**64 + 5
# served epoch 5) or reach the engine as a negative number. The one check of
# every such argument (set_epoch, load_state_dict, constructors, gathers):
POSITION_LIMIT = 1 << 63


def _position(value: Any, name: str, what: str = "") -> int:
    """`value` as an int in [0, 2**63); TypeError for a non-integer, ValueError (naming the value) otherwise."""
    v = operator.index(value)
    if not 0 <= v < POSITION_LIMIT:
        raise ValueError(f"{what}{name} must be >= 0 and < 2**63 (the range the sampler represents), got {value!r}")
    return v


UNSET: Any = object()  # an argument not given (its value comes from the config)


def _field_list(fields: Union[str, Sequence[str]], what: str) -> Tuple[str, ...]:
    out = (fields,) if isinstance(fields, str) else tuple(fields)
    if not out:
        raise ValueError(f"{what} needs at least one field")
    for f in out:
        if not isinstance(f, str):
            raise TypeError(f"{what}: field names must be str, got {f!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: fields {list(out)} name a field twice")
    return out


def _min_valid_note(min_valid: float, patch_size: Union[int, Tuple[int, int]]) -> str:
    """", min_valid=0.05: at least 3277 valid pixels of the 65536 in a window": the count the sampler asks for."""
    ph, pw = _patch_shape(patch_size)
    area = ph * pw
    need = max(1, math.ceil(min_valid * area) if min_valid < 1 else math.ceil(min_valid))
    return f", min_valid={min_valid:g}: at least {need} valid pixels of the {area} in a window"


def _best_window(store: Any, field: str, patch_size: Union[int, Tuple[int, int]], pixel_budget: int = 1 << 27) -> str:
    """", the best 40x40 window of any sample holds 25 (1.6%)": for an error message.

    Reads the masks (an error path only), at most `pixel_budget` pixels of them.
    """
    (ph, pw), best, seen, pixels = _patch_shape(patch_size), 0, 0, 0
    for i in range(len(store)):
        m = np.asarray(store.get(i, field))[0]
        if m.shape[0] < ph or m.shape[1] < pw:
            continue
        valid = (m != 0) & ~np.isnan(m)
        c = np.zeros((m.shape[0] + 1, m.shape[1] + 1), np.int64)
        c[1:, 1:] = valid.cumsum(0).cumsum(1)
        best = max(best, int((c[ph:, pw:] - c[:-ph, pw:] - c[ph:, :-pw] + c[:-ph, :-pw]).max()))
        seen, pixels = seen + 1, pixels + m.size
        if pixels >= pixel_budget:
            break
    if seen == 0:
        return ""
    among = "" if seen == len(store) else f" among the first {seen} samples"
    return f"; the best {ph}x{pw} window{among} holds {best} ({best / (ph * pw):.1%})"


def _patch_shape(patch_size: Any) -> Tuple[int, int]:
    """(h, w) of patch_size: P (P x P) or (h, w)."""
    if isinstance(patch_size, (tuple, list)):
        return int(patch_size[0]), int(patch_size[1])
    p = operator.index(patch_size)
    return p, p


def _patch_size(o: "_C.SamplerOptions", v: Any) -> None:
    """patch_size: P (P x P) or (h, w) -> patch_size, patch_h, patch_w."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"patch_size must be P or (h, w), got {v!r}")
        o.patch_h, o.patch_w = v
        o.patch_size = max(o.patch_h, o.patch_w)
    else:
        o.patch_size = v


def _ids(o: "_C.SamplerOptions", ids: Any) -> None:
    """ids: None (every sample) or sample ids (str) and/or store indices (int) -> ids, samples."""
    if ids is None:
        return
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"ids must be a list of sample ids or indices, not the string {ids!r}")
    names: List[str] = []
    indices: List[int] = []
    for v in ids:
        if isinstance(v, str):
            names.append(v)
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            if v < 0:
                raise ValueError(f"ids: sample index {v} is negative")
            indices.append(int(v))
        else:
            raise TypeError(f"ids must hold sample ids (str) or indices (int), got {v!r}")
    if not names and not indices:
        raise ValueError("ids is empty (None: every sample)")
    o.ids, o.samples = names, indices


def _prefetch(o: "_C.SamplerOptions", v: Any) -> None:
    """prefetch: True (the C++ default depth), False or 0 (off), or a number of batches."""
    if isinstance(v, bool):
        o.prefetch_next = v
        return
    try:
        depth = operator.index(v)
    except TypeError:
        raise TypeError(f"prefetch must be True, False or a number of batches, got {v!r}") from None
    o.prefetch_next = depth != 0
    if depth != 0:
        o.prefetch = depth


def _cache_budget(o: "_C.SamplerOptions", v: Any) -> None:
    """cache_budget: None (0: none), bytes (int), or a size such as "8GB" / "512MiB"."""
    if isinstance(v, str):
        try:
            v = int(_C.parse_byte_size(v))
        except ValueError as e:
            raise ValueError(f"cache_budget: {e}") from None
    elif isinstance(v, bool):
        raise TypeError(f"cache_budget must be bytes (int) or a size such as '8GB', got {v!r}")
    o.cache_budget = 0 if v is None else v


def _num_threads(o: "_C.SamplerOptions", v: Any) -> None:
    """num_threads: 0 means every core."""
    o.num_threads = (os.cpu_count() or 1) if (not isinstance(v, bool) and v == 0) else v


# Python spelling -> C++ value, where they differ (None for "off", P or (h, w), ...). Every other option
# is set as it is: the bound property checks its type, SamplerOptions::Validate its value.
_TO_NATIVE = {
    "patch_size": _patch_size,
    "require": lambda o, v: setattr(o, "require", "" if v is None else v),
    "positive_fraction": lambda o, v: setattr(o, "positive_fraction", -1.0 if v is None else v),
    "ids": _ids,
    "prefetch": _prefetch,
    "cache_budget": _cache_budget,
    "num_threads": _num_threads,
}


def to_native(fields: Union[str, Sequence[str]], config: Any, what: str) -> "_C.SamplerOptions":
    """The C++ options (``_C.SamplerOptions``) of `fields` and a SamplerConfig, validated in C++.

    Conversions only: a ValueError or TypeError names the loader (`what`) and the option.
    """
    o = _C.SamplerOptions()
    o.fields = list(_field_list(fields, what))
    return fill_native(o, _C.SAMPLER_OPTIONS, config, _TO_NATIVE, what)


_Options = TypeVar("_Options")


def fill_native(o: _Options, table: Sequence[Any], config: Any, converters: Mapping[str, Any], what: str) -> _Options:
    """Sets each option of `table` (rows of a C++ option table) on the C++ options `o` from `config`,
    through `converters[name](o, value)` where the Python spelling differs, then validates `o` in C++.

    A ValueError or TypeError names the caller (`what`) and the option. Shared by the frames and
    slice options.
    """
    for name in (row[0] for row in table):
        value = getattr(config, name)
        try:
            convert = converters.get(name)
            if convert is None:
                setattr(o, name, value)
            else:
                convert(o, value)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{what}: {e}") from None
    try:
        o.validate()  # type: ignore[attr-defined]
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    return o


def from_native(o: "_C.SamplerOptions") -> Dict[str, Any]:
    """{Python keyword: value} of C++ options, in the Python spelling (None for off, P or (h, w), ...)."""
    d = {row[0]: getattr(o, row[0]) for row in _C.SAMPLER_OPTIONS}
    ph, pw = (o.patch_h or o.patch_size), (o.patch_w or o.patch_size)
    d["patch_size"] = ph if ph == pw else (ph, pw)
    d["require"] = d["require"] or None
    d["positive_fraction"] = None if d["positive_fraction"] < 0 else d["positive_fraction"]
    d["ids"] = (list(o.ids) + list(o.samples)) or None
    d["prefetch"] = d["prefetch"] if o.prefetch_next else 0
    d["cache_budget"] = d["cache_budget"] or None
    return d


def order_options(order: Any, cache_budget: Any, what: str) -> Tuple[str, int]:
    """(order, budget bytes) of order= / cache_budget= of an item-order batch sampler (UNSET: the loaders'
    default), converted and checked as the loaders' (SamplerOptions::Validate)."""
    o = _C.SamplerOptions(fields=["-"])
    try:
        if order is not UNSET:  # else the C++ default
            o.order = order
        if cache_budget is not UNSET:
            _cache_budget(o, cache_budget)
        o.validate()
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what}: {e}") from None
    return o.order, int(o.cache_budget)


def public_options(o: "_C.SamplerOptions") -> Dict[str, Any]:
    """A loader's ``options``: {"fields": (...), and every option in the Python spelling}."""
    return {"fields": tuple(o.fields), **from_native(o)}


def _warn_skipped(native: "_C.Sampler", who: str) -> None:
    """The one warning about samples without a qualifying window, the same text for every loader."""
    report = native.skipped_report
    if report:
        warnings.warn(f"{who}: {report}", RuntimeWarning, stacklevel=3)


def check_batch_end(context: str, position: Tuple[int, int], n: int, windows_per_epoch: int) -> None:
    """ValueError when `n` windows from `position` (epoch, cursor) would go past the last epoch represented."""
    epoch, cursor = (int(v) for v in position)
    if epoch >= POSITION_LIMIT or (epoch == POSITION_LIMIT - 1 and cursor + n > windows_per_epoch):
        raise ValueError(f"{context}: batch({n}) would serve windows after epoch {POSITION_LIMIT - 1} (2**63 - 1), "
                         f"the last epoch the sampler represents (it is at window {cursor} of epoch {epoch}); call "
                         "set_epoch() to choose the epoch to serve")
