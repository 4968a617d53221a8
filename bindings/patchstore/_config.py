"""patchstore.SamplerConfig and patchstore.SliceConfig: the options of the loaders, each set as one value.

Built at import from the C++ option table (``_patchstore.SAMPLER_OPTIONS``,
``PATCHSTORE_SAMPLER_OPTIONS`` in reader/sampler.h): one field per option,
named by its Python keyword, whose default is the C++ default
(``patchstore::SamplerOptions``) in its Python spelling. No option, default
or rule is written here; ``_config.pyi`` declares the fields for type
checkers. PatchSampler, BatchLoader, PatchDataset and Store.montage take
``config=SamplerConfig(...)``, and the same options as keyword arguments.

SliceConfig is the same for the slices of volume stores, from the slice
option table (``_patchstore.SLICE_OPTIONS``, ``PATCHSTORE_SLICE_OPTIONS`` in
reader/slice_sampler.h): SliceDataset and Store.montage of a volume store
take ``config=SliceConfig(...)`` and its fields as keywords.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Sequence, Tuple

from . import _patchstore as _C
from ._sampler_options import UNSET, from_native, to_native
from ._slice_options import slice_defaults

__all__ = ["SamplerConfig", "SliceConfig", "OPTIONS", "SLICE_OPTION_NAMES", "UNSET", "positional_options",
           "resolve_config", "resolve_slice_config"]

#: The Python keywords of the sampling options, in table order.
OPTIONS: Tuple[str, ...] = tuple(row[0] for row in _C.SAMPLER_OPTIONS)
_DOCS: Dict[str, str] = {row[0]: row[2] for row in _C.SAMPLER_OPTIONS}
_DEFAULTS: Dict[str, Any] = from_native(_C.SamplerOptions(fields=["-"]))


def _doc() -> str:
    lines = ["The sampling options of PatchSampler, BatchLoader, PatchDataset and montage (defaults from C++).", "",
             "Every value is checked when the config is made, in C++ (SamplerOptions::Validate), with the words",
             "the loaders and the CLI use: SamplerConfig(patch_size=-3) raises ValueError.", ""]
    lines += [f"{name} (default {_DEFAULTS[name]!r}): {_DOCS[name]}" for name in OPTIONS]
    return "\n".join(lines)


def _check_sampler_config(self: Any) -> None:
    # Every value checked when the config is made, by the loaders' own check (to_native:
    # SamplerOptions::Validate in C++), on a placeholder field list as _DEFAULTS is read.
    to_native("-", self, "patchstore.SamplerConfig")


SamplerConfig = dataclasses.make_dataclass(
    "SamplerConfig",
    [(name, Any, dataclasses.field(default=_DEFAULTS[name])) for name in OPTIONS],
    frozen=True,
    namespace={"__doc__": _doc(), "__module__": __name__, "__post_init__": _check_sampler_config},
)
SamplerConfig.__module__ = __name__  # pickles as patchstore._config.SamplerConfig

#: The Python keywords of the slice options, in table order.
SLICE_OPTION_NAMES: Tuple[str, ...] = tuple(row[0] for row in _C.SLICE_OPTIONS)
_SLICE_DOCS: Dict[str, str] = {row[0]: row[2] for row in _C.SLICE_OPTIONS}
_SLICE_DEFAULTS: Dict[str, Any] = slice_defaults()


def _slice_doc() -> str:
    lines = ["The options of SliceDataset and the volume montage (defaults from C++).", ""]
    lines += [f"{name} (default {_SLICE_DEFAULTS[name]!r}): {_SLICE_DOCS[name]}" for name in SLICE_OPTION_NAMES]
    return "\n".join(lines)


SliceConfig = dataclasses.make_dataclass(
    "SliceConfig",
    [(name, Any, dataclasses.field(default=_SLICE_DEFAULTS[name])) for name in SLICE_OPTION_NAMES],
    frozen=True,
    namespace={"__doc__": _slice_doc(), "__module__": __name__},
)
SliceConfig.__module__ = __name__  # pickles as patchstore._config.SliceConfig


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays: compared element-wise
        return a is b


def _resolve(cls: Any, names: Tuple[str, ...], config: Any, options: Dict[str, Any], what: str) -> Any:
    unknown = [k for k in options if k not in names]
    if unknown:
        raise TypeError(f"{what}: unexpected keyword argument '{unknown[0]}' (options: {', '.join(names)})")
    if config is None:
        try:
            return cls(**options)
        except (TypeError, ValueError) as e:  # a value refused by the config's check: name the caller
            prefix = f"patchstore.{cls.__name__}: "
            msg = str(e)
            raise type(e)(f"{what}: {msg[len(prefix):]}" if msg.startswith(prefix) else msg) from None
    if not isinstance(config, cls):
        raise TypeError(f"{what}: config must be a patchstore.{cls.__name__}, got {type(config).__name__}")
    for k, v in options.items():
        if not _same(getattr(config, k), v):
            raise ValueError(f"{what}: {k}={v!r} contradicts config.{k}={getattr(config, k)!r} "
                             f"(give {k} in the config or as a keyword, not both)")
    return config


def resolve_config(config: Any, options: Dict[str, Any], what: str) -> Any:
    """The SamplerConfig of a loader call: `config` (or the defaults) with the keyword `options` set.

    TypeError for an unknown keyword or a config that is not a SamplerConfig; ValueError for a keyword
    that contradicts the config it comes with (give each option in one place).
    """
    return _resolve(SamplerConfig, OPTIONS, config, options, what)


def resolve_slice_config(config: Any, options: Dict[str, Any], what: str) -> Any:
    """The SliceConfig of a SliceDataset or volume montage call, as resolve_config does for SamplerConfig."""
    return _resolve(SliceConfig, SLICE_OPTION_NAMES, config, options, what)


def positional_options(what: str, patch_size: Any, positional: Sequence[Any], names: Sequence[str],
                       options: Dict[str, Any]) -> Dict[str, Any]:
    """The keyword arguments of a loader call, with patch_size and the older positional arguments
    (`names`, in the order the loader took them before SamplerConfig) added."""
    if len(positional) > len(names):
        raise TypeError(f"{what}: {len(positional)} positional arguments after the required ones; at most "
                        f"{len(names)} ({', '.join(names)}), the rest by keyword")
    given = dict(zip(names, positional))
    if patch_size is not UNSET:
        given["patch_size"] = patch_size
    for k in given:
        if k in options:
            raise TypeError(f"{what}: got multiple values for argument '{k}'")
    return {**given, **options}
