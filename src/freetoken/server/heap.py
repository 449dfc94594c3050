"""The server process's C heap: large blocks go back to the system when freed.

glibc raises its mmap threshold each time a mmapped block is freed (up to 32 MiB), so after one
large request body, later bodies of that size come from the arenas and stay resident once freed —
tens of MB per arena that no leak caused, on a machine whose RAM also holds the expert pool.
Pinning the threshold (which also stops the dynamic raise) keeps every block past it mmapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 4 * 2**20


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fixes glibc's mmap threshold at ``threshold`` bytes; False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
