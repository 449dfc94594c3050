"""Device memory outside torch's caching allocator, for the caches that elastic memory resizes (the KV
pool's layers, the expert-slot banks).

torch keeps freed blocks cached for its process: memory a shrink frees would reach another program only after
``torch.cuda.empty_cache()``, which also returns the engine's own cached working memory (a step's activations),
so the next step would allocate again, perhaps after the other program took everything. Allocated with the
driver (``cuMemAlloc``) instead, a resizable cache gives exactly its bytes back to the device the moment its
last tensor goes, and the engine's working memory stays cached. CPU tensors, or no driver library: plain
``torch.zeros`` (the caller then empties torch's cache after a resize).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
from typing import Any

import torch

log = logging.getLogger(__name__)

_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY


class _Driver:
    def __init__(self, lib: ctypes.CDLL) -> None:
        u64p, vp = ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p
        self.alloc = lib.cuMemAlloc_v2
        self.alloc.argtypes, self.alloc.restype = [u64p, ctypes.c_size_t], ctypes.c_int
        self.free = lib.cuMemFree_v2
        self.free.argtypes, self.free.restype = [ctypes.c_uint64], ctypes.c_int
        self.get_ctx = lib.cuCtxGetCurrent
        self.get_ctx.argtypes, self.get_ctx.restype = [ctypes.POINTER(vp)], ctypes.c_int
        self.push = lib.cuCtxPushCurrent_v2
        self.push.argtypes, self.push.restype = [vp], ctypes.c_int
        self.pop = lib.cuCtxPopCurrent_v2
        self.pop.argtypes, self.pop.restype = [ctypes.POINTER(vp)], ctypes.c_int


@functools.lru_cache(maxsize=1)
def _driver() -> _Driver | None:
    if not torch.cuda.is_available():
        return None
    try:
        return _Driver(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError) as exc:
        log.info("driver allocations unavailable (%s): resizable caches use torch's allocator", exc)
        return None


def uses_driver_memory(device: torch.device) -> bool:
    """Whether ``device_zeros`` on ``device`` bypasses torch's caching allocator."""
    return device.type == "cuda" and _driver() is not None


class _Block:
    """One driver allocation, exposed as bytes; freed (in its context) when the last tensor on it goes."""

    def __init__(self, drv: _Driver, ptr: int, nbytes: int, ctx: Any) -> None:
        self._drv, self._ptr, self._ctx = drv, ptr, ctx
        self.__cuda_array_interface__: dict[str, Any] = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None,
        }  # fmt: skip

    def __del__(self) -> None:  # pragma: no cover - runs on the GPU box
        try:
            d = self._drv
            d.push(self._ctx)  # the thread that drops the last tensor may have no current context
            d.free(self._ptr)
            d.pop(ctypes.byref(ctypes.c_void_p()))
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver frees everything anyway
            pass


def device_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-filled tensor of its own device allocation (see the module doc); raises
    ``torch.OutOfMemoryError`` when the device has not the bytes."""
    drv = _driver() if device.type == "cuda" else None
    nbytes = math.prod(shape) * dtype.itemsize
    if drv is None or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    with torch.cuda.device(device):
        torch.cuda.init()
        ctx = ctypes.c_void_p()
        drv.get_ctx(ctypes.byref(ctx))
        ptr = ctypes.c_uint64(0)
        rc = drv.alloc(ctypes.byref(ptr), nbytes)
        if rc == _OUT_OF_MEMORY:
            raise torch.OutOfMemoryError(f"the device has not {nbytes / 2**30:.2f} GiB free for a cache")
        if rc != 0:  # no current context or another driver refusal: torch's allocator then (said once)
            _say_fallback(rc)
            return torch.zeros(shape, dtype=dtype, device=device)
        raw = torch.as_tensor(_Block(drv, int(ptr.value), nbytes, ctx), device=device)
        raw.zero_()  # as bytes: every dtype (fp8 banks too) reads zeros
    return raw.view(dtype).view(shape)


@functools.lru_cache(maxsize=1)
def _say_fallback(rc: int) -> None:
    log.warning("cuMemAlloc failed with CUresult %d: resizable caches use torch's allocator", rc)
