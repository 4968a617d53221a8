"""The keyword checks the ingests and copy share: field templates, the source keywords (manifest= or root=
with fields=), encodings and layouts.

Conversions and checks of Python values only; the ingests themselves are in _ingest_api.py and
_ingest_volumes_api.py, the work in C++ (the compiled _ingest module).
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]


def _field_templates(fields: Any) -> List[Tuple[str, str]]:
    """dict {name: template}, pairs, or "name=template" strings -> [(name, template)]."""
    if fields is None:
        return []
    if isinstance(fields, Mapping):
        items = list(fields.items())
    else:
        items = []
        for f in fields:
            if isinstance(f, str):
                name, sep, tmpl = f.partition("=")
                if not sep:
                    raise ValueError(f"field template {f!r} is not NAME=TEMPLATE")
                items.append((name, tmpl))
            else:
                name, tmpl = f
                items.append((name, tmpl))
    out = []
    for name, tmpl in items:
        if not isinstance(name, str) or not name:
            raise ValueError(f"field name must be a non-empty str, got {name!r}")
        out.append((name, os.fspath(tmpl)))
    return out


@dataclass
class _Sources:
    """The checked source keywords of ingest_images / ingest_volumes, and the recorded call's arguments so far."""

    store: str
    manifest: str
    root: str
    templates: List[Tuple[str, str]]
    masks: List[str]
    norm: Dict[str, str]
    call_args: List[str]

    def set_on(self, o: Any) -> None:
        """Sets store, manifest, root, field_templates, mask_fields and norm of native ingest options `o`."""
        o.store, o.manifest, o.root = self.store, self.manifest, self.root
        o.field_templates = self.templates
        o.mask_fields = self.masks
        o.norm = self.norm


def _sources(
    who: str, store: PathLike, manifest: Any, root: Any, fields: Any, masks: Any, norm: Any, on_error: str
) -> _Sources:
    """Checks the keywords that name an ingest's sources (either manifest= or root= with fields=)."""
    if on_error not in ("stop", "skip"):
        raise ValueError(f"on_error must be 'stop' or 'skip', not {on_error!r}")
    if (manifest is None) == (root is None):
        raise ValueError(f"{who} needs either manifest= or root= (with fields=)")
    templates = _field_templates(fields)
    if root is not None and not templates:
        raise ValueError(f"{who} with root= needs fields={{name: template, ...}}")
    if manifest is not None and templates:
        raise ValueError(f"{who} takes fields= only with root=; a manifest names its fields in its header")
    mask_list = [masks] if isinstance(masks, str) else [str(m) for m in masks]
    norm_map = {str(k): str(v) for k, v in dict(norm or {}).items()}
    call_args = [repr(os.fspath(store))]
    if manifest is not None:
        call_args.append(f"manifest={os.fspath(manifest)!r}")
    if root is not None:
        call_args.append(f"root={os.fspath(root)!r}, fields={dict(templates)!r}")
    if mask_list:
        call_args.append(f"masks={mask_list!r}")
    if norm_map:
        call_args.append(f"norm={norm_map!r}")
    return _Sources(
        os.fspath(store),
        "" if manifest is None else os.fspath(manifest),
        "" if root is None else os.fspath(root),
        templates,
        mask_list,
        norm_map,
        call_args,
    )


EncodingArg = Union[str, Mapping[str, str], Iterable[str]]


def _encoding_specs(encoding: EncodingArg, who: str) -> List[str]:
    """encoding= -> the --encoding specs: "float32" | "compact" (every field), {field: encoding} (key "*": the
    other fields), or a list of CLI specs ["compact", "depth=float16"]."""
    if isinstance(encoding, str):
        return [encoding]
    if isinstance(encoding, Mapping):
        specs: List[str] = []
        for k, v in encoding.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"{who}: encoding= maps field names to encodings (str: str), got {k!r}: {v!r}")
            if k == "*":
                specs.insert(0, v)
            else:
                specs.append(f"{k}={v}")
        return specs
    try:
        specs = list(encoding)
    except TypeError:
        raise TypeError(
            f"{who}: encoding= is 'float32', 'compact', a dict {{field: encoding}} or a list of "
            f"'FIELD=ENCODING' specs, got {encoding!r}"
        ) from None
    if not all(isinstance(x, str) for x in specs):
        raise TypeError(f"{who}: encoding= list items are strings ('compact', 'depth=float16'), got {specs!r}")
    return specs


def _layout_arg(layout: str, tile_size: Optional[int], who: str) -> Tuple[str, int]:
    """(layout, tile edge) checked; tile edge 0 for None: the engine's default (a resumed store's own)."""
    if layout not in ("rows", "tiles"):
        raise ValueError(f"{who}: layout must be 'rows' or 'tiles', not {layout!r}")
    if tile_size is None:
        return layout, 0
    t = operator.index(tile_size)
    if t < 8 or t > 4096 or t % 8:
        raise ValueError(f"{who}: tile_size must be a multiple of 8 in 8..4096 (or None: the default), got {t}")
    return layout, t
