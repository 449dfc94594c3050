"""CUDA stream memory operations through the driver API (ctypes on ``libcuda``): the stream itself
writes a 32-bit value into pinned host memory, or waits until a value there is reached, in stream
order and without the host (``cuStreamWriteValue32`` / ``cuStreamWaitValue32``). The CPU expert
branch uses them to start CPU work and to hand results back without blocking the engine thread.

``stream_ops()`` returns None where they are unavailable (no CUDA driver library, a driver without
the calls, a device that refuses them) and logs why once; callers then use a host-side hand-off.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0, cyclic
WAIT_EQ = 0x1  # CU_STREAM_WAIT_VALUE_EQ: *addr == value
WRITE_DEFAULT = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: earlier writes of the stream are visible first


class StreamOpsError(RuntimeError):
    pass


class StreamOps:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._write = _symbol(lib, "cuStreamWriteValue32")
        self._wait = _symbol(lib, "cuStreamWaitValue32")
        self._devptr = _symbol(lib, "cuMemHostGetDevicePointer")
        u32, vp = ctypes.c_uint32, ctypes.c_void_p
        for fn in (self._write, self._wait):
            fn.argtypes, fn.restype = [vp, ctypes.c_uint64, u32, ctypes.c_uint], ctypes.c_int
        self._devptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), vp, ctypes.c_uint]
        self._devptr.restype = ctypes.c_int

    def device_ptr(self, flag: torch.Tensor) -> int:
        """The device address of a pinned host tensor's first element."""
        if flag.device.type != "cpu" or not flag.is_pinned():
            raise StreamOpsError("stream flags must live in pinned host memory")
        out = ctypes.c_uint64(0)
        if self._devptr(ctypes.byref(out), flag.data_ptr(), 0) != 0:
            return flag.data_ptr()  # unified addressing: pinned host memory has the same address on the GPU
        return int(out.value)

    def write(self, dptr: int, value: int, stream: torch.cuda.Stream | None = None) -> None:
        """Enqueue ``*dptr = value`` on the stream (after its earlier work, visible to the host)."""
        s = stream or torch.cuda.current_stream()
        _check(self._write(s.cuda_stream, dptr, value & 0xFFFFFFFF, WRITE_DEFAULT), "cuStreamWriteValue32")

    def wait(self, dptr: int, value: int, stream: torch.cuda.Stream | None = None, equal: bool = False) -> None:
        """Enqueue a wait: the stream's later work starts once ``*dptr`` has reached ``value`` (cyclic
        compare), or equals it with ``equal``."""
        s = stream or torch.cuda.current_stream()
        flags = WAIT_EQ if equal else WAIT_GEQ
        _check(self._wait(s.cuda_stream, dptr, value & 0xFFFFFFFF, flags), "cuStreamWaitValue32")


def _symbol(lib: ctypes.CDLL, name: str) -> Any:
    for n in (f"{name}_v2", name):  # CUDA >= 11.7 exports the _v2 entry points, enabled by default
        try:
            return getattr(lib, n)
        except AttributeError:
            continue
    raise StreamOpsError(f"the CUDA driver has no {name}")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise StreamOpsError(f"{what} failed with CUresult {rc}")


@functools.lru_cache(maxsize=1)
def stream_ops() -> StreamOps | None:
    """The driver's stream memory operations, checked once with a write-then-wait round trip on the
    current device; None (logged) where they are unavailable."""
    if not torch.cuda.is_available():
        return None
    try:
        ops = StreamOps(ctypes.CDLL("libcuda.so.1"))
        flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        dptr = ops.device_ptr(flag)
        ops.write(dptr, 5)
        ops.wait(dptr, 5)  # already reached: passes once the write is done
        torch.cuda.current_stream().synchronize()
        if int(flag[0]) != 5:
            raise StreamOpsError(f"the stream wrote {int(flag[0])}, not 5")
    except (OSError, StreamOpsError) as exc:
        log.warning("CUDA stream memory operations unavailable (%s): the CPU expert branch hands back "
                    "through the host", exc)
        return None
    return ops
