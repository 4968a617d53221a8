"""An int64 shared by the main process and DataLoader workers (_SharedEpoch).

At the bottom of the package (it imports no sibling), so that both the
loaders (patchstore.torch) and the resume logic (_resume) can use it.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.context
from typing import Any, Dict


class _SharedEpoch:
    """An int64 shared by the main process and DataLoader workers.

    Workers see set_epoch() even with persistent_workers=True: under fork the
    shared memory is inherited; under spawn/forkserver it is passed as a file
    descriptor while the worker is being started. Pickled at any other time
    (e.g. to disk), it is saved as a plain value.
    """

    def __init__(self, value: int = 0) -> None:
        self._shared: Any = None
        self._value = int(value)
        try:
            self._shared = multiprocessing.RawValue(ctypes.c_int64, int(value))
        except OSError:  # no shared memory available: per-process value
            self._shared = None

    @property
    def value(self) -> int:
        return int(self._shared.value) if self._shared is not None else self._value

    @value.setter
    def value(self, v: int) -> None:
        if self._shared is not None:
            self._shared.value = int(v)
        self._value = int(v)

    def __getstate__(self) -> Dict[str, Any]:
        if self._shared is not None and multiprocessing.context.get_spawning_popen() is not None:
            return {"shared": self._shared, "value": self.value}
        return {"shared": None, "value": self.value}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._value = state["value"]
        self._shared = state["shared"]
        if self._shared is None:
            self.__init__(state["value"])  # type: ignore[misc]
