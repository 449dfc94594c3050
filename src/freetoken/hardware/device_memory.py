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
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY
T = TypeVar("T")
# first_granted: the last (smallest) size is asked again this many times, waiting RETRY_WAIT_S, then twice as long
RETRIES = 6
RETRY_WAIT_S = 0.05


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
            if torch.cuda.is_current_stream_capturing():  # cuMemFree would void this thread's capture
                _DEFERRED.append((self._drv, self._ptr, self._ctx))
                return
            _free(self._drv, self._ptr, self._ctx)
            release_deferred()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver frees everything anyway
            pass


# Driver frees whose last tensor went while this thread captured a CUDA graph (a garbage collection inside a
# step's capture, say): cuMemFree synchronizes the device, which a capture forbids (it would fail the capture).
# Freed at the next free or allocation outside a capture, and after each capture (``release_deferred``).
_DEFERRED: list[tuple[_Driver, int, Any]] = []


def _free(drv: _Driver, ptr: int, ctx: Any) -> None:
    drv.push(ctx)  # the thread that drops the last tensor may have no current context
    drv.free(ptr)
    drv.pop(ctypes.byref(ctypes.c_void_p()))


def release_deferred() -> int:
    """Frees the driver allocations deferred during a capture (none while this thread captures); how many."""
    if not _DEFERRED or torch.cuda.is_current_stream_capturing():
        return 0
    n = 0
    while _DEFERRED:
        _free(*_DEFERRED.pop())
        n += 1
    return n


def device_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-filled tensor of its own device allocation (see the module doc); raises
    ``torch.OutOfMemoryError`` when the device has not the bytes."""
    drv = _driver() if device.type == "cuda" else None
    nbytes = math.prod(shape) * dtype.itemsize
    if drv is None or nbytes == 0:
        try:
            return torch.zeros(shape, dtype=dtype, device=device)
        except RuntimeError as exc:  # the CPU allocator's refusal is a plain RuntimeError: the same refusal
            if isinstance(exc, torch.OutOfMemoryError) or "allocate" not in str(exc):
                raise
            raise torch.OutOfMemoryError(f"the host has not {nbytes / 2**30:.2f} GiB free for a cache: {exc}") from exc
    with torch.cuda.device(device):
        torch.cuda.init()
        release_deferred()  # their bytes count for this allocation
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


def free_bytes(device: torch.device) -> int:
    """Bytes a cache on ``device`` could allocate now: the device's free memory (CUDA), else host RAM available
    (``psutil``), never more than the limits set on the process leave (``process_limit_left``)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    free = int(psutil.virtual_memory().available)
    left = process_limit_left()
    return free if left is None else min(free, left)


def process_limit_left() -> int | None:
    """What the limits set on this process leave it of host memory: the cgroup's (v2 ``memory.max``: a container's
    limit) and the address-space ulimit (``ulimit -v``); None where neither is set."""
    import resource
    from pathlib import Path

    import psutil

    left: list[int] = []
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            left.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        left.append(soft - int(psutil.Process().memory_info().vms))
    return max(0, min(left)) if left else None


def first_granted(make: Callable[[int], T], sizes: Sequence[int], what: str) -> tuple[int, T]:
    """``make(n)`` for the first size ``n`` the device grants, largest first (``sizes`` in the caller's order of
    preference; a size not below the one before it is skipped). Between a cache's free and its new allocation
    another program may take the memory: a refused size falls to the next, and the last one (the smallest the
    cache can be, holding everything it keeps) is asked again ``RETRIES`` times with a doubling wait (a program
    that takes memory usually leaves some, or gives some back). ``torch.OutOfMemoryError`` only when every
    ask was refused."""
    order: list[int] = []
    for n in sizes:
        if not order or n < order[-1]:
            order.append(n)
    wait, refused = RETRY_WAIT_S, 0
    for i, n in enumerate(order):
        last = i == len(order) - 1
        for attempt in range(RETRIES + 1 if last else 1):
            try:
                return n, make(n)
            except torch.OutOfMemoryError:
                refused += 1
                if last and attempt < RETRIES:
                    log.warning("the device refused %s of %d; asking again in %.2f s", what, n, wait)
                    time.sleep(wait)
                    wait *= 2
    raise torch.OutOfMemoryError(f"the device refused {what} at every size down to {order[-1]} ({refused} asks)")


def remake(
    make: Callable[[int], T],
    sizes: Sequence[int],
    current: int,
    drop: Callable[[], None],
    what: str,
    beside: bool = False,
) -> tuple[int, T]:
    """A cache of ``current`` units re-made at the first of ``sizes`` the device grants (``first_granted``). A
    shrink, or a grow where ``beside`` says the device has room for the new allocation next to the old one, first
    asks for its size beside the old allocation (make before break: nothing is lost if it is refused, and no
    moment where the freed memory waits for another program to take it); else, or when that is refused, it calls
    ``drop()`` (the old allocation goes) and then asks. Only the first size is tried beside: a smaller fallback
    that fits there would shrink the cache further than asked whenever free memory is short."""
    if sizes and (sizes[0] < current or beside):
        try:
            return sizes[0], make(sizes[0])
        except torch.OutOfMemoryError:
            pass
    drop()
    return first_granted(make, sizes, what)
