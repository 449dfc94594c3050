"""Whether Triton is importable here: the GPU paths use its kernels where it is, torch ops elsewhere."""

from __future__ import annotations

import functools


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
