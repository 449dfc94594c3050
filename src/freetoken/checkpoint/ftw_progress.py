"""Progress of a bank read (FTW banks, or the experts of a safetensors checkpoint): a shared byte counter, shown as
a rich bar on a terminal (quiet otherwise).

``ft serve`` loads under its own spinner: it wraps the load in ``shown_elsewhere()`` and shows ``current()`` in
the spinner's text, so two live displays never write to one terminal.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class LoadProgress:
    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done = total, label, 0
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None

    def advance(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)

    def describe(self) -> str:
        return f"{self.label}: {self.done / 1e9:.1f} / {self.total / 1e9:.1f} GB"


_lock = threading.Lock()
_current: LoadProgress | None = None
_elsewhere = 0  # nesting depth of shown_elsewhere()


def current() -> LoadProgress | None:
    """The bank read in progress in this process, if any."""
    return _current


@contextmanager
def shown_elsewhere() -> Iterator[None]:
    """While inside, loads draw no bar of their own (the caller shows ``current()``)."""
    global _elsewhere
    with _lock:
        _elsewhere += 1
    try:
        yield
    finally:
        with _lock:
            _elsewhere -= 1


@contextmanager
def tracked(total: int, label: str) -> Iterator[LoadProgress]:
    """Count a read of ``total`` bytes; one at a time per process (a nested one is refused)."""
    global _current
    with _lock:
        if _current is not None:
            raise RuntimeError("a bank read is already in progress in this process")
        p = _current = LoadProgress(total, label)
        show = _elsewhere == 0 and sys.stderr.isatty()
    bar = None
    try:
        if show:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

            bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                           console=Console(stderr=True), transient=True)  # fmt: skip
            bar.start()
            p._task, p._bar = bar.add_task(label, total=total), bar
        yield p
    finally:
        with p._lock:
            p._bar = None
        with _lock:
            _current = None
        if bar is not None:
            bar.stop()
