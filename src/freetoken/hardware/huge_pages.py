"""Transparent huge pages for the host expert pool.

The CPU expert kernel streams weight rows of a few KiB each (a Qwen3-30B-A3B ``gate_up`` row is 4 KiB: one
4 KiB page), so with ordinary pages every row is a new TLB entry, and the CPU's hardware prefetchers,
which stop at 4 KiB page boundaries, restart on every row. ``madvise(MADV_HUGEPAGE)`` before the pool is
first written lets Linux back it with 2 MiB pages where its THP setting is ``madvise`` (the common
default; ``always`` needs no advice, ``never`` refuses). Pinning (``cudaHostRegister``) keeps them.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

log = logging.getLogger(__name__)

MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def advise_huge_pages(t: torch.Tensor) -> int:
    """Ask for 2 MiB pages under ``t``'s storage (call before its first write); returns the bytes advised:
    the 2 MiB-aligned part inside it, 0 where the advice is unavailable or refused (said once in the log)."""
    libc = _libc()
    if libc is None or t.device.type != "cpu":
        return 0
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    lo = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    hi = end // HUGE_PAGE * HUGE_PAGE
    if hi <= lo:
        return 0
    if libc.madvise(ctypes.c_void_p(lo), hi - lo, MADV_HUGEPAGE) != 0:
        _refused(ctypes.get_errno())
        return 0
    return hi - lo


@functools.cache
def _refused(errno: int) -> None:
    log.info("huge pages for the expert pool refused (madvise errno %d): it stays on 4 KiB pages", errno)
    return None
