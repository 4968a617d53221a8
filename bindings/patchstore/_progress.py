"""Progress of patchstore.ingest_images / ingest_hdf5 on stderr, as the command line shows it.

On a terminal: a redrawn bar (tqdm's when tqdm is installed, else the same
bar as ``patchstore ingest``); elsewhere (logs, CI): a plain line every 5
seconds and a last one at the end, never both. ``progress=False`` prints
nothing; ``callback=`` is called with every progress report either way. A
report whose ``message`` is not empty is a notice (e.g. the projected store
size an ingest reports before it writes), printed on a line of its own.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional, Union

ProgressArg = Union[None, bool, Callable[[Any], None]]


def _human_rate(p: Any) -> float:
    return p.bytes / p.seconds / 1e6 if p.seconds > 0 else 0.0


class _Printer:
    """The command line's ProgressPrinter (cli/progress.h) in Python."""

    def __init__(self, what: str, unit: str, stream: Any, tty: bool) -> None:
        self.what, self.unit, self.stream, self.tty = what, unit, stream, tty
        self.last = -1e9
        self.final = False

    def __call__(self, p: Any) -> None:
        done = p.done >= p.total
        if done and self.final:
            return
        self.final = done
        now = time.monotonic()
        if not done and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        if self.tty:
            width = 30
            filled = width * p.done // p.total if p.total else width
            bar = "#" * filled + "." * (width - filled)
            line = (f"\r{self.what} [{bar}] {p.done}/{p.total} {self.unit}  {_human_rate(p):.0f} MB/s  "
                    f"{p.failed} failed " + ("\n" if done else ""))
        else:
            line = (f"{self.what}: {p.done}/{p.total} {self.unit}, {_human_rate(p):.0f} MB/s, {p.failed} failed, "
                    f"{p.seconds:.1f} s\n")
        try:
            self.stream.write(line)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed: stop printing, never fail the ingest
            self.final = True

    def notice(self, message: str) -> None:
        """A line of its own (Progress.message: e.g. the projected store size)."""
        try:
            self.stream.write(message + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self.final = True

    def close(self) -> None:
        pass


class _Tqdm:
    def __init__(self, what: str, unit: str, stream: Any) -> None:
        from tqdm import tqdm

        self.bar = tqdm(desc=what, unit=" " + unit, file=stream, total=None, dynamic_ncols=True)

    def __call__(self, p: Any) -> None:
        if self.bar.total != p.total:
            self.bar.total = p.total
        self.bar.set_postfix_str(f"{_human_rate(p):.0f} MB/s, {p.failed} failed", refresh=False)
        self.bar.update(p.done - self.bar.n)

    def notice(self, message: str) -> None:
        self.bar.write(message, file=self.bar.fp)

    def close(self) -> None:
        self.bar.close()


class Reporter:
    """progress(p) for the native ingest: prints as configured, then calls the user's callback."""

    def __init__(self, what: str, unit: str, progress: ProgressArg, callback: Optional[Callable[[Any], None]]) -> None:
        if callable(progress) and not isinstance(progress, bool):
            # progress=callable: the older spelling of callback=.
            if callback is not None:
                raise ValueError(f"{what}: give the callback once, as callback= (progress= takes True/False/None)")
            callback, progress = progress, False
        if progress not in (None, True, False):
            raise ValueError(f"{what}: progress must be None (auto), True or False, got {progress!r}")
        self.callback = callback
        self.what, self.unit = what, unit
        self.printer: Any = None
        stream = sys.stderr
        if progress is not False and stream is not None:
            try:
                tty = stream.isatty()
            except (AttributeError, ValueError, OSError):
                tty = False
            self.printer = self._make(what, unit, stream, tty)
        self.failed = False

    @staticmethod
    def _make(what: str, unit: str, stream: Any, tty: bool) -> Any:
        if tty:
            try:
                return _Tqdm(what, unit, stream)
            except ImportError:
                pass
        return _Printer(what, unit, stream, tty)

    def nothing_to_do(self, total: int, store: str) -> None:
        """The one line of a run that found every unit already in the store (the ingest reports nothing then)."""
        if self.printer is not None and not self.failed:
            try:
                self.printer.notice(f"{self.what}: all {total} {self.unit} already in '{store}': nothing to do")
            except Exception:  # a display problem never stops an ingest
                self.failed = True

    def __call__(self, p: Any) -> None:
        if self.printer is not None and not self.failed:
            try:
                if getattr(p, "message", ""):
                    self.printer.notice(p.message)
                else:
                    self.printer(p)
            except Exception:  # a display problem never stops an ingest
                self.failed = True
        if self.callback is not None:
            self.callback(p)

    def close(self) -> None:
        if self.printer is not None:
            try:
                self.printer.close()
            except Exception:
                pass

    def native(self) -> Optional[Callable[[Any], None]]:
        """What to give the C++ ingest (None when there is nothing to do)."""
        return None if self.printer is None and self.callback is None else self
