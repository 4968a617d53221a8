"""collate functions of patchstore.torch: PatchDataset items (collate) and SliceDataset items (slice_collate)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils.data import default_collate


def _consecutive(ts: List[Any]) -> Optional[torch.Tensor]:
    """If tensors `ts` are back-to-back slices of one storage, that memory as one (len, *shape) tensor."""
    t0 = ts[0]
    if not isinstance(t0, torch.Tensor) or not t0.is_contiguous():
        return None
    storage = t0.untyped_storage()
    step = t0.numel() * t0.element_size()
    for b, t in enumerate(ts):
        if (not isinstance(t, torch.Tensor) or t.dtype != t0.dtype or t.shape != t0.shape
                or t.device != t0.device or not t.is_contiguous()
                or t.untyped_storage().data_ptr() != storage.data_ptr()
                or t.data_ptr() != t0.data_ptr() + b * step):
            return None
    size = (len(ts),) + tuple(t0.shape)
    stride = [1] * len(size)  # contiguous, as set_ without strides computes them
    for d in range(len(size) - 2, -1, -1):
        stride[d] = stride[d + 1] * max(size[d + 1], 1)
    return t0.new_empty(0).set_(storage, t0.storage_offset(), size, stride)


def collate(batch: List[Any]) -> Any:
    """Collates PatchDataset items, flattening the k patches of each item into the batch.

    (Tuple items, as SliceDataset's, are collated by `slice_collate`.)

    Items {field: (k, C, P, P)} become {field: (B*k, C, P, P)} (a
    torch.cat collate); items {field: (C, P, P)} (k == 1) become (B, C, P, P).
    When the items come from PatchDataset's batched fetch (DataLoader calls
    __getitems__), their patches already lie back to back in one tensor and
    that tensor is returned without a copy. Anything else is collated by
    torch's default_collate (in shared memory inside workers), then flattened.
    """
    if not batch:
        return {}
    if isinstance(batch[0], tuple):
        return slice_collate(batch)
    if not isinstance(batch[0], dict):
        return default_collate(batch)
    out: Dict[str, Any] = {}
    for key in batch[0]:
        values = [item[key] for item in batch]
        first = values[0]
        joined = _consecutive(values)
        if joined is None:
            joined = default_collate(values)
        if isinstance(first, torch.Tensor) and first.dim() == 4:
            joined = joined.view(-1, *joined.shape[2:])
        out[key] = joined
    return out


def slice_collate(batch: List[Tuple[Any, ...]]) -> Tuple[Any, ...]:
    """Collates SliceDataset items (tuples of tensors) into a tuple of batches.

    Items (MR, CT, MASK), each (2c+1, H, W), become ((B, 2c+1, H, W), ...).
    When the items come from SliceDataset's batched fetch (DataLoader calls
    __getitems__), each field's stacks already lie back to back in one tensor
    (in shared memory inside a worker) and that tensor is passed through
    without a copy. Anything else is stacked by torch's default_collate.
    """
    if not batch:
        return ()
    if not isinstance(batch[0], tuple):
        return default_collate(batch)
    out = []
    for k in range(len(batch[0])):
        values = [item[k] for item in batch]
        joined = _consecutive(values)
        if joined is None:
            shapes = sorted({tuple(v.shape) for v in values if isinstance(v, torch.Tensor)})
            if len(shapes) > 1:
                raise ValueError(f"slice_collate: the items of this batch have {len(shapes)} different shapes "
                                 f"({', '.join(str(x) for x in shapes[:4])}{', ...' if len(shapes) > 4 else ''}): "
                                 f"their volumes have slices of different sizes; give SliceDataset a crop=(h, w) "
                                 f"no larger than the smallest slice")
        out.append(default_collate(values) if joined is None else joined)
    return tuple(out)
