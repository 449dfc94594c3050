"""``HostCopier``: the C++ copy-engine fill thread (``copier.h``) behind a checked ctypes wrapper.

Jobs wait for a ready flag in pinned memory, read a fill list ``[count, rows[kv], slots[kv]]`` from pinned
memory, and copy each listed pool row of every bank into its slot: on CUDA with ``cuMemcpyHtoDAsync`` on a
copy stream followed by a stream write of the done flag (the driver entry points come as addresses, see
``cuda_entry_points``), on the host (tests) with ``memcpy`` and a direct write of the done flag.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

import torch

from freetoken.experts.cpu.kernel import load_library

vp, u32, i32, i64, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
MAX_BANKS = 4


class CopyConfig(ctypes.Structure):
    _fields_ = [
        ("ctx_set_current", vp), ("memcpy_htod", vp), ("write_value32", vp), ("ctx", vp), ("stream", vp),
        ("nbanks", i32), ("src", vp * MAX_BANKS), ("dst", u64 * MAX_BANKS), ("row_bytes", i64 * MAX_BANKS),
        ("num_rows", i64), ("num_slots", i64),
    ]  # fmt: skip


class CopyJob(ctypes.Structure):
    _fields_ = [
        ("ready_flag", vp), ("ready_value", u32), ("mode", i32), ("list", vp), ("kv", i64),
        ("done_dev", u64), ("done_host", vp), ("done_value", u32),
    ]  # fmt: skip


@dataclass(frozen=True)
class CudaEntryPoints:
    """Addresses of the driver calls the copier makes, and the context it makes them in."""

    ctx_set_current: int
    memcpy_htod: int
    write_value32: int
    ctx: int


def cuda_entry_points() -> CudaEntryPoints:
    """The driver's ``cuCtxSetCurrent``, ``cuMemcpyHtoDAsync`` and ``cuStreamWriteValue32`` and the calling
    thread's current context (torch's, once CUDA is initialised)."""
    lib = ctypes.CDLL("libcuda.so.1")

    def addr(*names: str) -> int:
        for n in names:
            try:
                return int(ctypes.cast(getattr(lib, n), vp).value or 0)
            except AttributeError:
                continue
        raise RuntimeError(f"the CUDA driver has none of {names}")

    ctx = vp(0)
    get = lib.cuCtxGetCurrent
    get.argtypes, get.restype = [ctypes.POINTER(vp)], ctypes.c_int
    if get(ctypes.byref(ctx)) != 0 or not ctx.value:
        raise RuntimeError("no current CUDA context (initialise CUDA first)")
    return CudaEntryPoints(
        addr("cuCtxSetCurrent"),
        addr("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync"),
        addr("cuStreamWriteValue32_v2", "cuStreamWriteValue32"),
        int(ctx.value),
    )


def _bind(lib: ctypes.CDLL) -> None:
    lib.ft_copier_create.argtypes, lib.ft_copier_create.restype = [ctypes.c_int], vp
    lib.ft_copier_destroy.argtypes, lib.ft_copier_destroy.restype = [vp], None
    lib.ft_copier_configure.argtypes, lib.ft_copier_configure.restype = [vp, ctypes.POINTER(CopyConfig)], None
    lib.ft_copier_push.argtypes, lib.ft_copier_push.restype = [vp, ctypes.POINTER(CopyJob)], ctypes.c_int
    lib.ft_copier_drain.argtypes, lib.ft_copier_drain.restype = [vp], None
    lib.ft_copier_pending.argtypes, lib.ft_copier_pending.restype = [vp], i64
    lib.ft_copier_error.argtypes, lib.ft_copier_error.restype = [vp], ctypes.c_int
    lib.ft_copier_copies.argtypes, lib.ft_copier_copies.restype = [vp], i64


class HostCopier:
    """One copy thread. ``configure`` once with the banks (pool [N, ...] host tensors, slot banks with one
    row per slot and a scratch row: [S + 1, ...]), then ``push`` jobs; ``close`` (or collection) stops it,
    releasing queued jobs."""

    def __init__(self, spin_us: int = 50) -> None:
        lib = load_library()
        if lib is None:
            raise RuntimeError("the copier needs the native kernel library (no C++ compiler here)")
        _bind(lib)
        self._lib = lib
        self._h = lib.ft_copier_create(int(spin_us))
        if not self._h:
            raise RuntimeError("could not start the copy thread")
        self._finalizer = weakref.finalize(self, lib.ft_copier_destroy, self._h)
        self._keep: list[torch.Tensor] = []
        self._held: list[object] = []  # the queued jobs' tensors, until the queue drains

    def configure(
        self,
        pool_banks: list[torch.Tensor],
        slot_banks: list[torch.Tensor],
        stream: int = 0,
        cuda: CudaEntryPoints | None = None,
    ) -> None:
        if not 0 < len(pool_banks) == len(slot_banks) <= MAX_BANKS:
            raise ValueError(f"1..{MAX_BANKS} banks, pool and slots alike")
        cfg = CopyConfig()
        n_rows, n_slots = pool_banks[0].shape[0], slot_banks[0].shape[0] - 1
        for b, (src, dst) in enumerate(zip(pool_banks, slot_banks)):
            if src.device.type != "cpu" or not src.is_contiguous() or not dst.is_contiguous():
                raise ValueError("pool banks must be contiguous host tensors, slot banks contiguous")
            if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
                raise ValueError(f"bank {b}: pool rows {tuple(src.shape[1:])} {src.dtype} differ from slot rows "
                                 f"{tuple(dst.shape[1:])} {dst.dtype}")  # fmt: skip
            if src.shape[0] != n_rows or dst.shape[0] != n_slots + 1:
                raise ValueError("every bank needs the same pool rows and slots")
            if (dst.device.type == "cuda") != (cuda is not None):
                raise ValueError("CUDA slot banks need the driver entry points, host slot banks none")
            cfg.src[b], cfg.dst[b] = src.data_ptr(), dst.data_ptr()
            cfg.row_bytes[b] = src[0].numel() * src.element_size()
        cfg.nbanks, cfg.num_rows, cfg.num_slots = len(pool_banks), n_rows, n_slots
        if cuda is not None:
            cfg.ctx_set_current, cfg.memcpy_htod, cfg.write_value32 = (
                cuda.ctx_set_current, cuda.memcpy_htod, cuda.write_value32)  # fmt: skip
            cfg.ctx, cfg.stream = cuda.ctx, stream
        self._keep = [*pool_banks, *slot_banks]
        self._lib.ft_copier_configure(self._h, ctypes.byref(cfg))

    @staticmethod
    def job(
        ready: torch.Tensor, ready_value: int, fill_list: torch.Tensor, done: torch.Tensor, done_value: int,
        done_dev: int = 0, toggle: bool = False,
    ) -> CopyJob:  # fmt: skip
        """Checked job arguments: ready / done int32 [1] pinned (or host) flags, fill_list int64 [1 + 2 kv]."""
        checks = (("ready", ready, torch.int32), ("done", done, torch.int32), ("list", fill_list, torch.int64))
        for name, t, dt in checks:
            if t.device.type != "cpu" or t.dtype != dt or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous host {dt} tensor")
        if fill_list.numel() < 1 or fill_list.numel() % 2 != 1:
            raise ValueError("the fill list holds 1 + 2 * kv int64 values")
        job = CopyJob(ready.data_ptr(), ready_value & 0xFFFFFFFF, int(toggle), fill_list.data_ptr(),
                      (fill_list.numel() - 1) // 2, done_dev, done.data_ptr(), done_value & 0xFFFFFFFF)  # fmt: skip
        job.tensors = (ready, fill_list, done)  # the job holds raw pointers: keep what they point to alive
        return job

    def push(self, job: CopyJob, ready_value: int | None = None, done_value: int | None = None) -> None:
        if ready_value is not None:
            job.ready_value = ready_value & 0xFFFFFFFF
        if done_value is not None:
            job.done_value = done_value & 0xFFFFFFFF
        if len(self._held) > 256 and self.pending() == 0:  # nothing queued reads the older ones
            self._held.clear()
        self._held.append(getattr(job, "tensors", None))  # the queue copies the pointers, not the tensors
        rc = self._lib.ft_copier_push(self._h, ctypes.byref(job))
        if rc != 0:
            raise ValueError(f"copier rejected the job ({rc})")

    def drain(self) -> None:
        self._lib.ft_copier_drain(self._h)
        self._held.clear()

    def pending(self) -> int:
        return int(self._lib.ft_copier_pending(self._h))

    def copies(self) -> int:
        return int(self._lib.ft_copier_copies(self._h))

    def error(self) -> str | None:
        rc = int(self._lib.ft_copier_error(self._h))
        if rc == 0:
            return None
        return "a fill list entry was out of range" if rc == -4 else f"CUDA driver call failed (CUresult {rc})"

    def close(self) -> None:
        self._finalizer()
