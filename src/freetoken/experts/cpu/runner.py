"""The CPU branch behind a submit/wait shape: routed experts run on the host, from the pool.

``submit`` takes the step's routes as codes (``-1 - eid`` = run here, anything else = not here) and
returns at once; ``wait`` returns the float32 partial ``[T, D]`` on the compute device. The C++ expert
kernel (``freetoken.experts.cpu``: its own pinned workers, GIL released) does the work. On the CPU
device ``submit`` starts it directly; on CUDA a feeder thread waits for the inputs' copy and calls it.
Pools in a dtype the kernel does not take run the torch reference in the feeder thread instead.

On CUDA, decode-sized batches go through ``StreamedCpuBranch`` (``streamed.py``): the stream itself
starts the CPU work and waits for it, the host never blocks. Without stream memory operations or Triton
(its staging kernel), or for batches larger than its buffers, the inputs travel to pinned host buffers
with one async copy, a worker thread waits on a CUDA event and ``wait`` blocks the host until the partial
is back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from freetoken.experts.cpu.defaults import auto_isa
from freetoken.experts.cpu.kernel import CpuExpertKernel
from freetoken.experts.cpu.reference import cpu_experts_reference
from freetoken.experts.cpu.stream_ops import stream_ops
from freetoken.experts.cpu.streamed import StreamedCpuBranch, StreamedHandle
from freetoken.experts.host_pool import HostExpertPool
from freetoken.hardware.cpus import default_kernel_threads
from freetoken.hardware.profile import profile_kernel_threads
from freetoken.kernels.triton_support import use_triton

STREAMED_MAX_TOKENS = 64  # per-layer pinned buffers of the streamed branch hold this many tokens


@dataclass
class CpuResult:
    out: torch.Tensor  # [T, D] float32 on the host
    experts: int  # distinct experts run
    seconds: float  # wall time of the compute


def _routes_here(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The routes this branch runs (code ``-1 - row``; codes >= 0 run elsewhere): their route indices and
    pool rows (int64)."""
    mine = codes < 0
    return torch.arange(codes.numel())[mine], -1 - codes[mine]


@dataclass
class CpuHandle:
    device: torch.device
    future: Future[CpuResult] | None = None  # fed by the feeder thread (CUDA, torch fallback)
    direct: CpuResult | None = None  # submitted straight to the kernel (CPU device): wait() completes it
    streamed: StreamedHandle | None = None  # ordered by the CUDA stream: wait() enqueues, never blocks


def _submit_routes(
    kernel: CpuExpertKernel, pool: HostExpertPool, x: torch.Tensor, codes: torch.Tensor, w: torch.Tensor, k: int
) -> CpuResult:
    """Start the kernel on the routes with codes < 0 (x [T, D], codes [K], w [K]); returns at once.

    The result's ``out`` is valid after ``kernel.wait()``; ``seconds`` holds the start time until then.
    """
    t0 = time.perf_counter()
    routes, rows = _routes_here(codes)
    tok = torch.div(routes, k, rounding_mode="floor").to(torch.int32)
    out = kernel.submit(x.float().contiguous(), tok, rows.contiguous(), w[routes].contiguous(), pool.gate_up, pool.down,
                        pool.activation, scales=pool.scales, bias=pool.gate_up_bias)  # fmt: skip
    return CpuResult(out, int(rows.unique().numel()), t0)


def _run_routes_kernel(
    kernel: CpuExpertKernel, pool: HostExpertPool, x: torch.Tensor, codes: torch.Tensor, w: torch.Tensor, k: int
) -> CpuResult:
    """Synchronous ``_submit_routes``: float32 [T, D] and the wall time."""
    if kernel.queued():  # streamed batches of earlier layers go first (their flags are in the stream)
        kernel.drain()
    res = _submit_routes(kernel, pool, x, codes, w, k)
    kernel.wait()
    res.seconds = time.perf_counter() - res.seconds
    return res


def _run_routes(pool: HostExpertPool, x: torch.Tensor, codes: torch.Tensor, w: torch.Tensor, k: int) -> CpuResult:
    """``_run_routes_kernel`` by the kernel's torch reference, for banks of a dtype the kernel does not take."""
    t0 = time.perf_counter()
    routes, rows = _routes_here(codes)
    tok = torch.div(routes, k, rounding_mode="floor").to(torch.int32)
    out = cpu_experts_reference(x.float(), tok, rows, w[routes].float(), pool.gate_up, pool.down, pool.activation,
                                scales=pool.scales, gate_up_bias=pool.gate_up_bias)  # fmt: skip
    return CpuResult(out, int(rows.unique().numel()), time.perf_counter() - t0)


# Synchronous batches reading at most this many weight bytes run on the calling thread alone: waking a worker
# costs more than it saves there, and on a loaded machine every barrier waits for it to be scheduled
# (docs/benchmarks.md, "the CPU decode step").
INLINE_BYTES = 2 << 20


def make_kernel(dtype: torch.dtype, threads: int | None, isa: str = "auto") -> CpuExpertKernel | None:
    """The C++ expert kernel for banks of ``dtype`` (None for a dtype it does not take) with ``threads``
    computing threads in all: the workers and the thread that runs each batch (the feeder, or the caller of
    ``wait()``), which takes units too. None: the count this machine's profile chose (``ft bench bw --sweep``), else
    ``default_kernel_threads()``."""
    # fp8: with 128x128 block scales; uint8: FP4 (MXFP4 / NVFP4) with their scale rows
    if dtype not in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.uint8):
        return None
    n = (profile_kernel_threads() or default_kernel_threads()) if threads is None else threads
    isa = auto_isa(dtype == torch.uint8) if isa == "auto" else isa
    return CpuExpertKernel(num_threads=max(1, n - 1), isa=isa, caller_helps=True, inline_bytes=INLINE_BYTES)


class CpuExpertRunner:
    def __init__(
        self,
        pool: HostExpertPool,
        device: torch.device,
        threads: int | None = None,
    ) -> None:
        self.pool = pool
        self.device = device
        self.threads = threads
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ft-cpu-experts")
        self.kernel = make_kernel(pool.gate_up.dtype, threads)
        self._want_streamed = self.kernel is not None and use_triton(device)
        self._streamed: StreamedCpuBranch | None = None

    def _streamed_for(self, tokens: int, top_k: int) -> StreamedCpuBranch | None:
        """The stream-ordered branch when it can take this batch (built on first use)."""
        if not self._want_streamed or self.kernel is None or self.kernel.backend != "native":
            return None
        if self._streamed is None:
            ops = stream_ops()
            if ops is None:
                self._want_streamed = False
                return None
            self._streamed = StreamedCpuBranch(self.kernel, self.pool, ops, self.device, STREAMED_MAX_TOKENS, top_k)
        return self._streamed if self._streamed.fits(tokens, top_k) else None

    @property
    def streamed(self) -> bool:
        """Whether decode batches hand back through the stream (known after the first CUDA batch)."""
        return self._streamed is not None

    def _run(self, x: torch.Tensor, codes: torch.Tensor, w: torch.Tensor, k: int) -> CpuResult:
        """In the feeder thread (on CUDA the only caller of the kernel object)."""
        if self.kernel is not None:
            return _run_routes_kernel(self.kernel, self.pool, x, codes, w, k)
        return _run_routes(self.pool, x, codes, w, k)

    def submit(self, x: torch.Tensor, codes: torch.Tensor, topk_w: torch.Tensor, layer: int = 0) -> CpuHandle:
        """x [T, D], codes [T*k] route codes, topk_w [T, k] of MoE layer ``layer``; returns without waiting."""
        k = topk_w.shape[1]
        branch = self._streamed_for(x.shape[0], k) if self.device.type == "cuda" else None
        if branch is not None:
            return CpuHandle(self.device, streamed=branch.submit(layer, x, codes, topk_w))
        w = topk_w.reshape(-1).float()
        if self.device.type == "cuda":
            dev = (x.float(), codes, w)  # converted on the device, then one D2H copy each
            xh, ch, wh = (torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in dev)
            for host, src in zip((xh, ch, wh), dev):
                host.copy_(src, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()

            def job() -> CpuResult:
                ready.synchronize()  # the worker thread waits, the engine thread does not
                return self._run(xh, ch, wh, k)

            return CpuHandle(self.device, future=self._exec.submit(job))
        if self.kernel is not None:  # no thread handoff: the kernel's own workers run it, GIL released
            return CpuHandle(self.device, direct=_submit_routes(self.kernel, self.pool, x, codes, w, k))
        return CpuHandle(self.device, future=self._exec.submit(self._run, x, codes, w, k))

    def wait(self, handle: CpuHandle) -> tuple[torch.Tensor, CpuResult | None]:
        """The float32 partial [T, D] on the compute device, and the worker's measurements (None for a
        streamed batch: ``collect()`` returns those later)."""
        if handle.streamed is not None:
            assert self._streamed is not None
            return self._streamed.wait(handle.streamed), None
        if handle.direct is not None:
            assert self.kernel is not None
            self.kernel.wait()
            res = handle.direct
            res.seconds = time.perf_counter() - res.seconds
        else:
            assert handle.future is not None
            res = handle.future.result()
        out = res.out
        if handle.device.type == "cuda":
            out = out.pin_memory().to(handle.device, non_blocking=True)
        return out, res

    def can_capture(self, tokens: int, top_k: int) -> bool:
        """Whether this batch's CPU branch can live in a CUDA graph (the streamed branch takes it)."""
        return self.device.type == "cuda" and self._streamed_for(tokens, top_k) is not None

    def push_replay(self, layer: int, tokens: int) -> None:
        assert self._streamed is not None
        self._streamed.push_replay(layer, tokens)

    def push_replay_many(self, items: Sequence[tuple[int, int]]) -> None:
        assert self._streamed is not None
        self._streamed.push_replay_many(items)

    def cancel_replay(self) -> None:
        if self._streamed is not None:
            self._streamed.cancel_replay()

    def collect(self) -> tuple[int, float]:
        """(experts, seconds) of streamed batches finished since the last call; call at a safe point
        between steps."""
        return self._streamed.collect() if self._streamed is not None else (0, 0.0)

    def close(self) -> None:
        if self._streamed is not None:
            self._streamed.close()  # before the kernel goes: queued batches finish, nothing waits forever
        self._exec.shutdown(wait=True)
        if self.kernel is not None:
            self.kernel.close()
