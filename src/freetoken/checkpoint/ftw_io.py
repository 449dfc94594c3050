"""Reading FTW files straight into their final memory: aligned host buffers and parallel ``O_DIRECT`` reads.

``aligned_empty`` maps anonymous memory (nothing written to it: the kernel hands out pages as the reads land,
advised onto transparent huge pages) whose start is on a huge-page boundary and whose end has slack up to the next
``ALIGNMENT``, so the last, padded block of a file can be read in place. ``read_parts`` reads every (file, memory)
pair in ``CHUNK``-sized pieces on a few threads with ``pread`` (the GIL is released in the syscall); each file is
opened with ``O_DIRECT`` (no page cache: no second copy of the bytes, no eviction of the user's cache), and where
the filesystem refuses it (tmpfs, some network filesystems) read buffered instead, said once.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_manifest import HUGE_PAGE, round_up

log = logging.getLogger(__name__)

CHUNK = 16 << 20  # bytes per pread: large enough for the device's full queue, small enough to spread over threads
_warned_buffered = False


def read_threads() -> int:
    return min(16, max(4, os.cpu_count() or 4))


def aligned_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An unwritten CPU tensor starting on a huge-page boundary, with slack to the next ``ALIGNMENT`` after it."""
    nbytes = dtype.itemsize
    for s in shape:
        nbytes *= int(s)
    size = round_up(max(nbytes, 1), HUGE_PAGE) + HUGE_PAGE
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # THP off: 4 KiB pages, still correct
    probe = torch.frombuffer(mm, dtype=torch.uint8, count=1)
    off = (-probe.data_ptr()) % HUGE_PAGE
    del probe
    whole = torch.frombuffer(mm, dtype=torch.uint8, count=size - off, offset=off)  # holds the mapping alive
    return whole[:nbytes].view(dtype).view(tuple(int(s) for s in shape))


def byte_view(t: torch.Tensor, offset: int, length: int) -> memoryview:
    """``length`` writable bytes of ``t``'s storage from byte ``offset`` of ``t`` (may run into the storage's
    slack past ``t``'s end)."""
    storage = t.untyped_storage()
    start = t.storage_offset() * t.element_size() + offset
    if start + length > storage.nbytes():
        raise ValueError(f"{length} bytes at {start} run past the buffer ({storage.nbytes()} bytes)")
    whole = torch.empty(0, dtype=torch.uint8).set_(storage)
    return memoryview(whole.numpy()).cast("B")[start : start + length]  # type: ignore[arg-type]


@dataclass(frozen=True)
class Read:
    path: Path
    dst: memoryview  # file_bytes long (data and padding), aligned to ALIGNMENT when read directly
    nbytes: int  # the data bytes among them (for progress)


class _Opened:
    """One file's descriptor, direct when the filesystem takes it; reopened buffered on the first EINVAL."""

    def __init__(self, path: Path, direct: bool) -> None:
        self.path, self.lock = path, threading.Lock()
        self.direct = direct and hasattr(os, "O_DIRECT")
        self._old: list[int] = []
        self.fd = self._open()

    def _open(self) -> int:
        flags = os.O_RDONLY | (os.O_DIRECT if self.direct else 0)
        try:
            return os.open(self.path, flags)
        except OSError as e:
            if self.direct and e.errno == errno.EINVAL:
                self._to_buffered()
                return os.open(self.path, os.O_RDONLY)
            raise CheckpointError(f"{self.path}: cannot open ({e.strerror})") from e

    def _to_buffered(self) -> None:
        global _warned_buffered
        self.direct = False
        if not _warned_buffered:
            _warned_buffered = True
            log.warning("%s: the filesystem does not take O_DIRECT; reading FTW files through the page cache",
                        self.path.parent)  # fmt: skip

    def pread_into(self, dst: memoryview, offset: int) -> int:
        fd, direct = self.fd, self.direct
        try:
            return os.preadv(fd, [dst], offset)
        except OSError as e:
            if e.errno != errno.EINVAL or not direct:
                raise CheckpointError(f"{self.path}: read failed at byte {offset} ({e.strerror})") from e
        with self.lock:  # O_DIRECT opened but not honoured: the same file, buffered (other threads may still
            if self.direct:  # be reading through the direct descriptor: it is closed with the file)
                self._old.append(self.fd)
                self.fd = os.open(self.path, os.O_RDONLY)
                self._to_buffered()
        return os.preadv(self.fd, [dst], offset)

    def close(self) -> None:
        for fd in [self.fd, *self._old]:
            os.close(fd)


def read_parts(
    reads: Sequence[Read],
    direct: bool = True,
    threads: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Fill every ``Read.dst`` from the start of its file, in parallel; a short file is refused by name."""
    files = {r.path: _Opened(r.path, direct) for r in reads}
    jobs = [(r, off) for r in reads for off in range(0, len(r.dst), CHUNK)]
    try:
        with ThreadPoolExecutor(threads or read_threads(), thread_name_prefix="ftw-read") as pool:
            for _ in pool.map(lambda j: _read_chunk(files[j[0].path], j[0], j[1], on_bytes), jobs):
                pass
    finally:
        for f in files.values():
            f.close()


def _read_chunk(f: _Opened, r: Read, off: int, on_bytes: Callable[[int], None] | None) -> None:
    end = min(off + CHUNK, len(r.dst))
    at = off
    while at < end:
        got = f.pread_into(r.dst[at:end], at)
        if got <= 0 and at >= r.nbytes:  # the data is in; a file may end before its padding
            break
        if got <= 0:
            raise CheckpointError(f"{r.path}: ends at byte {at}, expected {len(r.dst)} (truncated?)")
        at += got
    if on_bytes is not None:
        on_bytes(max(0, min(end, r.nbytes) - off))


def drop_page_cache(path: Path) -> None:
    """Ask the kernel to forget ``path``'s cached pages (benchmarks: a cold read without root)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
