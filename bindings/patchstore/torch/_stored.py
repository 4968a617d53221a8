"""Stored-dtype batches and their conversion to float32 on any device: the one place that knows how.

A gather can write each field in its stored dtype (``output="stored"``: uint8/uint16/int16 source values of a
compact store, float16, float32) instead of float32: 2.5-3.3x fewer bytes through DataLoader workers and over
PCIe. `FloatConverter` turns such tensors into the float32 values a float32 read returns, bit for bit,
wherever they are (CPU or CUDA): integer fields through the field's table of normalised values (256 or 65,536
float32 values computed once by the C++ reader, ``Reader.value_table``), so no arithmetic is redone on the device;
float16 by the exact IEEE widening; float32 as is. BatchLoader(device=...), `to_float` and the datasets'
``output="stored"`` all use it.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .._store import Store, reader_of
from ._common import _batch_tensor

#: torch dtype of each stored dtype name (FieldInfo.dtype).
TORCH_DTYPES: Dict[str, torch.dtype] = {"float32": torch.float32, "uint8": torch.uint8, "uint16": torch.uint16,
                                        "int16": torch.int16, "float16": torch.float16}

OUTPUTS = ("float32", "stored")


def check_output(output: Any, who: str) -> str:
    """`output` as one of OUTPUTS, or ValueError naming them."""
    if output not in OUTPUTS:
        raise ValueError(f"{who}: output must be 'float32' or 'stored', got {output!r}")
    return str(output)


def stored_dtypes(store: Store, fields: Sequence[str]) -> Dict[str, torch.dtype]:
    """{field: torch dtype of its stored elements}."""
    info = store.fields
    out = {}
    for f in fields:
        name = info[f].dtype
        if name not in TORCH_DTYPES:
            raise ValueError(f"field '{f}' of '{store.path}' is stored as {name}, which has no torch dtype")
        out[f] = TORCH_DTYPES[name]
    return out


def check_device(device: Any, who: str) -> Optional[torch.device]:
    """None, or `device` as a torch.device that this process can use (ValueError otherwise)."""
    if device is None:
        return None
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{who}: device must be None, 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{who}: device={device!r} but torch.cuda.is_available() is False in this process")
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"{who}: device must be 'cpu' or 'cuda', got {device!r}")
    return d


class FloatConverter:
    """Converts stored-dtype tensors of a store's fields to the float32 values a float32 read gives, bit for bit.

    source: a `patchstore.Store` (or its path), or a loader/dataset of patchstore.torch (its store and
    fields; a SliceDataset's ``clamp`` is applied after the conversion, as its float32 items have it).
    fields: the field order of tuple batches (default: the source's fields). device: where the float32 tensors
    are made (default: where each input tensor is); inputs elsewhere are copied there first
    (``non_blocking`` for pinned inputs). convert_threads: threads of a CPU conversion (default
    ``torch.get_num_threads()``); on the CPU the result lands in buffers reused once nothing refers to them.

    ``conv(batch)`` accepts what the loaders yield: a dict {field: tensor}, a tuple/list in field order, or one
    tensor when there is one field. A tensor already float32 is returned as is (moved to `device`).
    """

    def __init__(self, source: Any, fields: Optional[Sequence[str]] = None, device: Any = None,
                 clamp: Optional[Mapping[str, Tuple[float, float]]] = None,
                 convert_threads: Optional[int] = None) -> None:
        store = source if isinstance(source, Store) else getattr(source, "store", None)
        if store is None:
            store = Store(source)
        self.store: Store = store
        if fields is None:
            fields = getattr(source, "fields", None)
        if fields is None:
            fields = list(store.fields)
        self.fields: Tuple[str, ...] = (fields,) if isinstance(fields, str) else tuple(fields)
        if clamp is None:
            clamp = getattr(source, "clamp", None)
        self.clamp: Dict[str, Tuple[float, float]] = dict(clamp or {})
        self.device = check_device(device, "patchstore.torch.FloatConverter")
        self.dtypes = stored_dtypes(store, self.fields)
        # CPU conversions: C++ (the reader's own conversion) on this many threads, into reused buffers.
        self.convert_threads = torch.get_num_threads() if convert_threads is None else max(1, int(convert_threads))
        r = self._reader = reader_of(store)
        self._host_tables: Dict[str, Optional[torch.Tensor]] = {}
        for f in self.fields:
            raw = r.value_table(f)
            table = None if raw is None else torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
            self._host_tables[f] = table
        self._tables: Dict[Tuple[str, torch.device], torch.Tensor] = {}

    def table(self, field: str, device: torch.device) -> Optional[torch.Tensor]:
        """The field's value table on `device` (None for float fields), copied there once."""
        host = self._host_tables[field]
        if host is None:
            return None
        key = (field, device)
        t = self._tables.get(key)
        if t is None:
            t = self._tables[key] = host.to(device)
        return t

    def convert(self, field: str, x: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """One tensor of `field` (its stored dtype, or float32 already) as float32 on the converter's device."""
        if field not in self.dtypes:
            raise KeyError(f"FloatConverter: no field '{field}' among {list(self.fields)}")
        device = self.device if self.device is not None else x.device
        if x.device != device:
            x = x.to(device, non_blocking=non_blocking)
        stored = self.dtypes[field]
        if x.dtype == torch.float32:
            out = x  # float32 already (stored so, or converted): only the clamp, which is idempotent
        elif x.dtype != stored:
            raise TypeError(f"FloatConverter: field '{field}' is stored as {stored}, got a {x.dtype} tensor")
        elif device.type == "cpu":
            # The reader's conversion (the table, or exact float16 widening) with the GIL released, into a
            # buffer reused once the caller lets go of it: a fresh tensor per batch costs a page fault per 4 KiB.
            x = x.contiguous()
            out = _batch_tensor(self, tuple(x.shape), False, len(self.fields))
            self._reader.convert_stored(field, x.numpy(), out.view(-1).numpy(), self.convert_threads)
        elif stored == torch.float16:
            out = x.float()  # exact: every float16 value is a float32 value
        else:
            table = self.table(field, device)
            if table is None:
                out = x.float()
            else:
                index = x.reshape(-1).to(torch.int32)
                if stored == torch.int16:
                    index = index + 32768
                out = table.index_select(0, index).view(x.shape)
        c = self.clamp.get(field)
        if c is not None:
            out = out.clamp_(c[0], c[1]) if out is not x else out.clamp(c[0], c[1])
        return out

    def __call__(self, batch: Any, non_blocking: bool = False) -> Any:
        if isinstance(batch, torch.Tensor):
            if len(self.fields) != 1:
                raise TypeError(f"FloatConverter: a single tensor for {len(self.fields)} fields; pass a dict or tuple")
            return self.convert(self.fields[0], batch, non_blocking)
        if isinstance(batch, Mapping):
            return {f: (self.convert(f, t, non_blocking) if f in self.dtypes and isinstance(t, torch.Tensor) else t)
                    for f, t in batch.items()}
        if isinstance(batch, (tuple, list)):
            if len(batch) != len(self.fields):
                raise TypeError(f"FloatConverter: {len(batch)} tensors for fields {list(self.fields)}")
            out: List[Any] = [self.convert(f, t, non_blocking) for f, t in zip(self.fields, batch)]
            return tuple(out) if isinstance(batch, tuple) else out
        raise TypeError(f"FloatConverter: expected a dict, tuple or tensor, got {type(batch).__name__}")


_converters: "weakref.WeakKeyDictionary[Any, Dict[Any, FloatConverter]]" = weakref.WeakKeyDictionary()


def to_float(batch: Any, source: Any, device: Any = None, non_blocking: bool = False) -> Any:
    """A batch of stored-dtype tensors (``output="stored"``) as the float32 batch the same loader gives without it.

    Bit for bit equal to the float32 output, on CPU or GPU: for the DataLoader path, let the workers ship the
    stored bytes (2.5-3.3x fewer than float32) and convert after the transfer:

    ```python
    train = PatchDataset("frames.ps", ["rgb", "mask", "depth"], patch_size=256, output="stored")
    loader = DataLoader(train, batch_sampler=train.batch_sampler(16, shuffle=True), num_workers=2,
                        pin_memory=True, collate_fn=collate)
    for batch in loader:
        batch = to_float(batch, train, device="cuda", non_blocking=True)
    ```

    source: the dataset or loader that made the batch (its store, fields and clamp), a Store, or a store path.
    device: where the result goes (default: where the batch is). The field tables are copied to a device once
    per source (see `FloatConverter`).
    """
    d = check_device(device, "patchstore.torch.to_float")
    try:
        per = _converters.setdefault(source, {})
    except TypeError:  # not weak-referenceable (a path string): no cache
        per = {}
    conv = per.get(d)
    if conv is None:
        conv = per[d] = FloatConverter(source, device=d)
    return conv(batch, non_blocking)


class DeviceFeed:
    """BatchLoader(device=...): a stored-dtype batch in a ring slot to `device`, converted there unless stored.

    CUDA: the copy runs on a side stream from the pinned slot (``non_blocking``); the slot's event marks the
    copy's end so the ring refills it only after, and the current stream waits for the copy before the
    conversion, which runs there. CPU: the conversion reads the slot directly.
    """

    def __init__(self, converter: FloatConverter, device: torch.device, convert: bool) -> None:
        self.converter, self.device, self.convert = converter, device, convert
        self.cuda = device.type == "cuda"
        self.stream: Any = torch.cuda.Stream(device=device) if self.cuda else None  # type: ignore[no-untyped-call]

    def __call__(self, slot: Any, n: int, fields: Sequence[str]) -> Dict[str, torch.Tensor]:
        views = {f: slot.tensors[f][:n] for f in fields}
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            with torch.cuda.stream(self.stream):
                moved = {f: t.to(self.device, non_blocking=True) for f, t in views.items()}
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(self.stream)
            slot.event = event  # the ring waits for it before refilling the slot
            current.wait_stream(self.stream)
            for t in moved.values():
                t.record_stream(current)  # allocated on the side stream, used on the current one
        else:
            moved = views
        if not self.convert:
            return moved
        return {f: self.converter.convert(f, t) for f, t in moved.items()}


__all__ = ["FloatConverter", "to_float"]
