"""The options of the window sampler, one set for every loader (PatchSampler, BatchLoader, PatchDataset, montage).

Checks what users pass and turns it into the keyword arguments of
``patchstore._patchstore.Sampler`` (the C++ ``patchstore::SamplerOptions``,
reader/sampler.h); the skip warning and the messages about min_valid.
No sampling happens here: windows are drawn by the C++ sampler only.
"""

from __future__ import annotations

import math
import operator
import os
import warnings
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

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


def _subset(ids: Any, what: str) -> Tuple[List[str], List[int]]:
    """ids= of a loader: None (every sample) or sample ids (str) and/or store indices (int)."""
    if ids is None:
        return [], []
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{what}: ids must be a list of sample ids or indices, not the string {ids!r}")
    names: List[str] = []
    indices: List[int] = []
    for v in ids:
        if isinstance(v, str):
            names.append(v)
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            if v < 0:
                raise ValueError(f"{what}: ids: sample index {v} is negative")
            indices.append(int(v))
        else:
            raise TypeError(f"{what}: ids must hold sample ids (str) or indices (int), got {v!r}")
    if not names and not indices:
        raise ValueError(f"{what}: ids is empty (None: every sample)")
    return names, indices


def _cache_budget(cache_budget: Any, what: str) -> int:
    """cache_budget= of a loader: None (0: none), bytes (int), or a size such as "8GB" / "512MiB"."""
    if cache_budget is None:
        return 0
    if isinstance(cache_budget, str):
        try:
            return int(_C.parse_byte_size(cache_budget))
        except ValueError as e:
            raise ValueError(f"{what}: cache_budget: {e}") from None
    if isinstance(cache_budget, bool):
        raise TypeError(f"{what}: cache_budget must be bytes (int) or a size such as '8GB', got {cache_budget!r}")
    b = operator.index(cache_budget)
    if not 0 < b < 2 ** 64:
        raise ValueError(f"{what}: cache_budget must be a positive number of bytes, got {cache_budget!r}")
    return b


def _order_options(order: Any, cache_budget: Any, what: str) -> Tuple[str, int]:
    """(order, budget bytes) of order= / cache_budget=: 'random', or 'locality' with a budget."""
    if order not in ("random", "locality"):
        raise ValueError(f"{what}: order must be 'random' or 'locality', got {order!r}")
    budget = _cache_budget(cache_budget, what)
    if order == "locality" and budget == 0:
        raise ValueError(f"{what}: order='locality' needs cache_budget= (bytes, or a size such as '8GB'): the "
                         f"page cache an epoch may count on, e.g. half of the RAM free for it")
    return order, budget


def _sampler_options(fields, patch_size, patches_per_sample, require, min_valid, positive_fraction, seed, rank,
                     world_size, num_threads, flip, rot90, what="PatchSampler", *, ids=None,
                     policy="auto", prefetch=True, order="random", cache_budget=None) -> Dict[str, Any]:
    """The checked options of the C++ sampler, as keyword arguments of _C.Sampler.

    One set of options and meanings for PatchSampler, BatchLoader and
    PatchDataset: patch_size P or (h, w); ids: a subset (sample ids or
    indices); policy: "auto" (from require / positive_fraction), "uniform",
    "min_valid" or "positive_fraction" (reader/sampler.h); prefetch: read
    ahead the next batches' windows (True: DEFAULT_PREFETCH_BATCHES of
    them; N: N; False or 0: off); order: "random" or "locality" (with
    cache_budget, reader/order.h).
    """
    fields = _field_list(fields, what)
    if isinstance(patch_size, (tuple, list)):
        if len(patch_size) != 2:
            raise ValueError(f"{what}: patch_size must be P or (h, w), got {patch_size!r}")
        ph, pw = (operator.index(v) for v in patch_size)
    else:
        ph = pw = operator.index(patch_size)
    if not (1 <= ph < 2 ** 31 and 1 <= pw < 2 ** 31):
        raise ValueError(f"{what}: patch_size must be in [1, 2**31), got {patch_size!r}")
    if rot90 and ph != pw:
        raise ValueError(f"{what}: rot90 needs a square patch (a quarter turn of a {ph}x{pw} window is "
                         f"{pw}x{ph}, and a batch has one shape); use flip, or a square patch_size")
    if not isinstance(policy, str):  # the names are checked by the C++ sampler (ParseSamplingPolicy)
        raise TypeError(f"{what}: policy must be a policy name, got {policy!r}")
    names, indices = _subset(ids, what)
    k = operator.index(patches_per_sample)
    if not 1 <= k < 2 ** 31:
        raise ValueError(f"{what}: patches_per_sample must be in [1, 2**31), got {patches_per_sample!r}")
    if require is not None and not isinstance(require, str):
        raise TypeError(f"{what}: require must be a field name or None, got {require!r}")
    mv = float(min_valid)
    if not mv > 0:
        raise ValueError(f"{what}: min_valid must be positive (pixels >= 1, or a fraction of the window < 1), "
                         f"got {min_valid!r}")
    if not mv <= ph * pw:
        raise ValueError(f"{what}: min_valid {min_valid!r} asks for more valid pixels than a {ph}x{pw} window "
                         f"holds ({ph * pw})")
    if positive_fraction is None:
        pf = -1.0
    else:
        pf = float(positive_fraction)
        if not 0 <= pf <= 1:
            raise ValueError(f"{what}: positive_fraction must be in [0, 1] or None, got {positive_fraction!r}")
        if require is None:
            raise ValueError(f"{what}: positive_fraction needs require=<mask field>")
    s = operator.index(seed)
    if not 0 <= s < 2 ** 64:
        raise ValueError(f"{what}: seed must be in [0, 2**64), got {seed!r}")
    r, w = operator.index(rank), operator.index(world_size)
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"{what}: need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")
    if w >= 2 ** 31:
        raise ValueError(f"{what}: world_size must be < 2**31, got {world_size!r}")
    t = operator.index(num_threads)
    if t == 0:
        t = os.cpu_count() or 1
    if not 1 <= t <= 4096:
        raise ValueError(f"{what}: num_threads must be in [1, 4096] (or 0 for all cores), got {num_threads!r}")
    order, budget = _order_options(order, cache_budget, what)
    if isinstance(prefetch, bool):
        depth = _C.DEFAULT_PREFETCH_BATCHES if prefetch else 0
    else:
        try:
            depth = operator.index(prefetch)
        except TypeError:
            raise TypeError(f"{what}: prefetch must be True, False or a number of batches, got {prefetch!r}") from None
        if not 0 <= depth <= 64:
            raise ValueError(f"{what}: prefetch must be a number of batches in 0..64 (0: off), got {prefetch!r}")
    return dict(fields=list(fields), patch_size=max(ph, pw), patch_h=ph, patch_w=pw, patches_per_sample=k,
                require=require or "", min_valid=mv, positive_fraction=pf, seed=s, rank=r, world_size=w,
                num_threads=t, flip=bool(flip), rot90=bool(rot90), policy=policy, ids=names, samples=indices,
                prefetch=depth, order=order, cache_budget=budget)


def _public_options(options: Mapping[str, Any]) -> Dict[str, Any]:
    """The user-facing form of _sampler_options' result (patch_size P or (h, w), None for off)."""
    o = dict(options)
    ph, pw = o.pop("patch_h"), o.pop("patch_w")
    o["patch_size"] = ph if ph == pw else (ph, pw)
    o["require"] = o["require"] or None
    o["positive_fraction"] = None if o["positive_fraction"] < 0 else o["positive_fraction"]
    o["fields"] = tuple(o["fields"])
    names, indices = o.pop("ids"), o.pop("samples")
    o["ids"] = (list(names) + list(indices)) or None
    o["cache_budget"] = o.get("cache_budget") or None
    return o


def _warn_skipped(native: "_C.Sampler", who: str) -> None:
    """The one warning about samples without a qualifying window, the same text for every loader."""
    report = native.skipped_report
    if report:
        warnings.warn(f"{who}: {report}", RuntimeWarning, stacklevel=3)
