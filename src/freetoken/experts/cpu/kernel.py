"""``CpuExpertKernel``: a checked Python wrapper over the C++ expert kernel (ctypes, raw pointers).

Shapes: T tokens, D hidden, I intermediate, R routes, N pool rows (``eid = layer * E + expert``).
Inputs: x float32 [T, D]; routes as tok int32 [R], row int64 [R], weight float32 [R]; banks gate_up
[N, 2I, D] and down [N, D, I], both bfloat16, both float32, or both float8_e4m3fn with ``scales`` (their fp32
128x128 block scales, ``args.check_scales``); out float32 [T, D]. All contiguous CPU tensors. ctypes
drops the GIL during every call, so ``submit`` returns at once and the workers run while the caller
(the hybrid backend's GPU branch) goes on; ``wait`` blocks until they are done (taking work units
itself meanwhile unless ``caller_helps=False``). One caller thread per object.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence

import torch

from freetoken.experts.cpu.args import (
    ERRORS,
    MoeArgs,
    QueuedArgs,
    Scales,
    check_args,
    check_bias,
    check_tensor,
    kernel_format,
    scale_ptrs,
)
from freetoken.experts.cpu.defaults import DEFAULT_ROWS_FP4, ROW_BLOCKS, default_rows
from freetoken.experts.cpu.library import ISAS, load_library
from freetoken.experts.cpu.reference import ACTIVATIONS, cpu_experts_reference
from freetoken.hardware.cpus import default_kernel_threads, physical_cores, worker_cpus

__all__ = ["ISAS", "CpuExpertKernel", "cpu_experts_reference", "load_library"]

# Machines with at least this many physical cores let waiting threads poll briefly (for the next
# layer's batch, for the next step of a batch) before sleeping; smaller ones always sleep at once.
SPIN_MIN_CORES = 8
DEFAULT_SPIN_US = 50


class PreparedBatches:
    """Checked batches (``enqueue``'s or ``toggle_flags``' arguments) and their token counts as the C arrays
    ``enqueue_many`` passes: built once per replayed step shape, queued many times. Keeps ``args`` alive."""

    def __init__(self, args: Sequence[QueuedArgs], tokens: Sequence[int]) -> None:
        if len(args) != len(tokens):
            raise ValueError(f"{len(args)} batches but {len(tokens)} token counts")
        self.args = list(args)
        self.n = len(self.args)
        self.ptrs = (ctypes.c_void_p * max(1, self.n))(*[ctypes.addressof(a) for a in self.args])
        self.tokens = (ctypes.c_int64 * max(1, self.n))(*[int(t) for t in tokens])


class CpuExpertKernel:
    """Routed experts on the CPU, on a persistent pool of pinned worker threads that sleep when idle.

    ``num_threads``: workers (None: physical cores - 1, min 1). ``isa``: "auto" (best supported) or one of
    ``ISAS``. ``pin``: pin worker k to its own physical core. ``spin_us``: how long idle workers poll before
    sleeping (None: ``DEFAULT_SPIN_US`` on machines with at least ``SPIN_MIN_CORES`` physical cores, else 0:
    never spin on few cores). ``caller_helps``: the thread blocked in ``wait()``/``run()`` computes units too
    (it would only sleep otherwise; on a busy machine it may do the whole batch before a worker is
    scheduled). ``rows``: at batch 1, weight rows each thread streams at once (1, 2 or 4; the AVX2 path caps
    it at 2; None: ``default_rows``, and ``DEFAULT_ROWS_FP4`` for FP4 banks). ``inline_bytes``: ``run`` computes
    batches whose routes read at most this many weight bytes on the calling thread alone (0: never). Results do not
    depend on the thread count, the rows or where a batch runs. Without a compiler it falls back to the torch
    reference (``backend == "torch"``), synchronously.
    """

    def __init__(
        self,
        num_threads: int | None = None,
        isa: str = "auto",
        pin: bool = True,
        spin_us: int | None = None,
        caller_helps: bool = True,
        rows: int | None = None,
        inline_bytes: int = 0,
    ) -> None:
        n = default_kernel_threads() if num_threads is None else int(num_threads)
        if n < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if isa != "auto" and isa not in ISAS:
            raise ValueError(f"isa must be 'auto' or one of {ISAS}, got {isa!r}")
        self.num_threads = n
        self.caller_helps = caller_helps
        self.inline_bytes = inline_bytes
        self._lib = load_library()
        self._pool: int | None = None
        self._inflight: tuple[torch.Tensor, ...] | None = None
        self.isa = "torch"
        self.rows, self.rows_fp4, self.spin_us = 1, 1, 0
        if rows is not None and rows not in ROW_BLOCKS:
            raise ValueError(f"rows must be one of {ROW_BLOCKS}, got {rows}")
        if self._lib is None:
            return
        isa_id = self._lib.ft_best_isa() if isa == "auto" else ISAS.index(isa)
        if not self._lib.ft_isa_supported(isa_id):
            raise ValueError(f"ISA {isa!r} is not supported by this CPU or this build")
        cpus = (ctypes.c_int * n)(*worker_cpus(n)) if pin and n <= physical_cores() else None
        if spin_us is None:
            spin_us = DEFAULT_SPIN_US if physical_cores() >= SPIN_MIN_CORES else 0
        self.spin_us = max(0, int(spin_us))
        self._pool = self._lib.ft_pool_create(n, cpus, isa_id, self.spin_us)
        if not self._pool:
            raise RuntimeError("could not create the CPU expert worker pool")
        self.isa = ISAS[isa_id]
        self.rows = default_rows(self.isa) if rows is None else int(rows)
        self.rows_fp4 = DEFAULT_ROWS_FP4 if rows is None else int(rows)
        self._lib.ft_pool_set_rows(self._pool, self.rows, self.rows_fp4)
        self._finalizer = weakref.finalize(self, self._lib.ft_pool_destroy, self._pool)

    @property
    def backend(self) -> str:
        return "native" if self._pool else "torch"

    def submit(
        self,
        x: torch.Tensor,
        tok: torch.Tensor,
        row: torch.Tensor,
        weight: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        activation: str = "silu",
        out: torch.Tensor | None = None,
        scales: Scales | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Start a batch and return ``out`` at once; its content is valid after ``wait()``. ``bias``: float32
        [N, 2I] gate/up biases added before the activation (gpt-oss), or None."""
        return self._begin(x, tok, row, weight, gate_up, down, activation, out, scales, inline=False, bias=bias)

    def _begin(
        self,
        x: torch.Tensor,
        tok: torch.Tensor,
        row: torch.Tensor,
        weight: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        activation: str,
        out: torch.Tensor | None,
        scales: Scales | None,
        inline: bool,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Checked arguments to the library: started on the workers, or (``inline``) computed on this thread."""
        if self._inflight is not None:
            raise RuntimeError("the previous batch is still running: call wait() first")
        if self.queued():
            raise RuntimeError("queued batches are pending: call drain() first")
        check_args(x, tok, row, weight, gate_up, down, activation, out, bounds=self._pool is None, scales=scales)
        bias_ptr = check_bias(gate_up, bias)
        T, D = x.shape
        if out is None:
            out = torch.empty((T, D), dtype=torch.float32)
        if self._pool is None or self._lib is None:
            cpu_experts_reference(x, tok, row, weight, gate_up, down, activation, out=out, scales=scales,
                                  gate_up_bias=bias)  # fmt: skip
        else:
            args = MoeArgs(
                x.data_ptr(), T, D, gate_up.shape[1] // 2,
                tok.data_ptr(), row.data_ptr(), weight.data_ptr(), row.shape[0],
                gate_up.data_ptr(), down.data_ptr(), gate_up.shape[0],
                kernel_format(gate_up, scales), ACTIVATIONS.index(activation), out.data_ptr(), *scale_ptrs(scales),
                bias_ptr,
            )  # fmt: skip
            call = self._lib.ft_moe_run_inline if inline else self._lib.ft_moe_submit
            rc = call(self._pool, ctypes.byref(args))
            if rc == -6:
                raise MemoryError(ERRORS[rc])
            if rc != 0:
                raise ValueError(ERRORS.get(rc, f"kernel error {rc}"))
        if not inline:  # keep every buffer alive until the workers are done with it
            kept = (*(scales or ()), *(() if bias is None else (bias,)))
            self._inflight = (x, tok, row, weight, gate_up, down, out, *kept)
        return out

    def wait(self) -> None:
        """Block (GIL released) until the submitted batch is finished."""
        if self._pool is not None and self._lib is not None:
            self._lib.ft_wait(self._pool, int(self.caller_helps))
        self._inflight = None

    def run(
        self,
        x: torch.Tensor,
        tok: torch.Tensor,
        row: torch.Tensor,
        weight: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        activation: str = "silu",
        out: torch.Tensor | None = None,
        scales: Scales | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Synchronous ``submit`` + ``wait``; returns out float32 [T, D]. Batches reading up to ``inline_bytes`` of
        weights run on the calling thread alone (no worker woken)."""
        inline = row.shape[0] * (gate_up[0].nbytes + down[0].nbytes) <= self.inline_bytes
        out = self._begin(x, tok, row, weight, gate_up, down, activation, out, scales, inline, bias=bias)
        if not inline:
            self.wait()
        return out

    def enqueue(
        self,
        x: torch.Tensor,
        codes: torch.Tensor,
        weight: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        out: torch.Tensor,
        ready: tuple[torch.Tensor, int],
        done: tuple[torch.Tensor, int],
        stats: torch.Tensor | None = None,
        activation: str = "silu",
        scales: Scales | None = None,
        bias: torch.Tensor | None = None,
    ) -> QueuedArgs:
        """Queue a batch that starts once ``ready[0][0]`` reaches ``ready[1]`` (cyclic int32 compare);
        returns at once. Routes come as codes: x [T, D] float32, codes int64 [T*k] (``c < 0``: token
        ``i // k`` runs here, on pool row ``-1 - c``; ``c >= 0``: not here), weight float32 [T*k], out
        float32 [T, D] (fully written). When out (and ``stats`` int64 [4]: distinct rows, routes, ns, error)
        is written, ``done[0][0]`` is set to ``done[1]``, also when the batch failed (out is
        then zeros; ``queue_error()`` says why). The caller keeps every tensor alive until then. Native
        backend only. Returns the checked arguments, for ``enqueue_prepared``."""
        if self._pool is None or self._lib is None:
            raise RuntimeError("queued batches need the native kernel (this one is the torch fallback)")
        if self._inflight is not None:
            raise RuntimeError("a submitted batch is still running: call wait() first")
        T = x.shape[0] if x.dim() == 2 else -1
        k = codes.numel() // T if T > 0 else 1
        check_args(x, torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int64),
                   torch.zeros(0), gate_up, down, activation, out, scales=scales)
        check_tensor("codes", codes, (torch.int64,), 1)
        check_tensor("weight", weight, (torch.float32,), 1)
        if T > 0 and (codes.numel() != T * k or weight.numel() != codes.numel()):
            raise ValueError(f"codes and weight must hold T*k entries for T={T}, got {codes.numel()}, "
                             f"{weight.numel()}")
        for name, (flag, _) in (("ready flag", ready), ("done flag", done)):
            check_tensor(name, flag, (torch.int32,), 1)
        if stats is not None:
            check_tensor("stats", stats, (torch.int64,), 1)
            if stats.numel() < 4:
                raise ValueError("stats must hold 4 elements")
        args = QueuedArgs(
            x.data_ptr(), T, x.shape[1], gate_up.shape[1] // 2, codes.data_ptr(), weight.data_ptr(), max(k, 1),
            gate_up.data_ptr(), down.data_ptr(), gate_up.shape[0],
            kernel_format(gate_up, scales), ACTIVATIONS.index(activation), out.data_ptr(), *scale_ptrs(scales),
            check_bias(gate_up, bias),
            ready[0].data_ptr(), ready[1] & 0xFFFFFFFF, done[0].data_ptr(), done[1] & 0xFFFFFFFF,
            None if stats is None else stats.data_ptr(),
        )  # fmt: skip
        self.enqueue_prepared(args, T, ready[1], done[1])
        return args

    def enqueue_prepared(self, args: QueuedArgs, tokens: int, ready_value: int, done_value: int) -> None:
        """Queue again a batch ``enqueue`` checked (same buffers, which must hold ``tokens`` rows): only
        the token count and the flag values change. The decode hot path: no argument checks.
        ``toggle_flags`` makes a copy for replayed CUDA graphs."""
        if self._pool is None or self._lib is None:
            raise RuntimeError("queued batches need the native kernel (this one is the torch fallback)")
        args.T, args.ready_value, args.done_value = tokens, ready_value & 0xFFFFFFFF, done_value & 0xFFFFFFFF
        rc = self._lib.ft_moe_enqueue(self._pool, ctypes.byref(args))
        if rc != 0:
            raise ValueError(ERRORS.get(rc, f"kernel error {rc}"))

    def enqueue_many(self, batch: PreparedBatches) -> None:
        """Queue every batch of ``batch`` at once, in order (one C call: a replayed step's layers). Their flag
        values are the ones they hold (toggle batches: 1 and 1)."""
        if self._pool is None or self._lib is None:
            raise RuntimeError("queued batches need the native kernel (this one is the torch fallback)")
        rc = self._lib.ft_moe_enqueue_many(self._pool, batch.ptrs, batch.tokens, batch.n)
        if rc != 0:
            raise ValueError(ERRORS.get(rc, f"kernel error {rc}"))

    @staticmethod
    def toggle_flags(
        args: QueuedArgs, ready: torch.Tensor, done: torch.Tensor, stats: torch.Tensor | None = None
    ) -> QueuedArgs:
        """A copy of checked arguments on toggle flags (int32 CPU tensors, e.g. pinned): the batch starts
        once ``ready[0] == ready_value`` and resets it to 0; the waiting side resets ``done`` itself. For
        CUDA graphs, whose stream writes replay fixed values."""
        for name, flag in (("ready flag", ready), ("done flag", done)):
            check_tensor(name, flag, (torch.int32,), 1)
        copy = QueuedArgs.from_buffer_copy(args)
        copy.ready_flag, copy.done_flag, copy.mode = ready.data_ptr(), done.data_ptr(), 1
        if stats is not None:  # its own stats row: sequence batches of the same layer may be running
            check_tensor("stats", stats, (torch.int64,), 1)
            copy.stats = stats.data_ptr()
        return copy

    def queued(self) -> int:
        """Queued batches not yet done (0 on the torch fallback)."""
        return int(self._lib.ft_queue_pending(self._pool)) if self._pool and self._lib else 0

    def drain(self) -> None:
        """Block until every queued batch is done (their ready flags must come)."""
        if self._pool is not None and self._lib is not None:
            self._lib.ft_queue_drain(self._pool)

    def queue_error(self) -> str | None:
        """What the first failed queued batch since the last call met, or None."""
        rc = int(self._lib.ft_queue_error(self._pool)) if self._pool and self._lib else 0
        return None if rc == 0 else ERRORS.get(rc, f"kernel error {rc}")

    def trace(self, cap: int) -> None:
        """Record the next queued batches' timeline (``batch_trace.py``), the last ``cap`` kept; 0: off."""
        if self._pool is not None and self._lib is not None:
            self._lib.ft_queue_trace(self._pool, max(0, int(cap)))

    def take_trace(self, max_batches: int = 1 << 16) -> torch.Tensor:
        """The recorded batches since the last call, oldest first: int64 [n, fields] (``batch_trace.py``)."""
        if self._pool is None or self._lib is None:
            return torch.zeros((0, 0), dtype=torch.int64)
        out = torch.zeros((max_batches, int(self._lib.ft_queue_trace_fields())), dtype=torch.int64)
        n = int(self._lib.ft_queue_take_trace(self._pool, out.data_ptr(), max_batches))
        return out[:n]

    def stream_read(self, buf: torch.Tensor) -> int:
        """Sum ``buf``'s bytes as uint64 words with the kernel's workers (a read-bandwidth probe)."""
        if not buf.is_contiguous() or buf.device.type != "cpu":
            raise ValueError("buf must be a contiguous CPU tensor")
        nbytes = buf.numel() * buf.element_size()
        if self._pool is None or self._lib is None:
            return int(buf.view(torch.uint8)[: nbytes - nbytes % 8].view(torch.int64).sum())
        return int(self._lib.ft_stream_read(self._pool, buf.data_ptr(), nbytes))

    def close(self) -> None:
        """Stop and join the workers (also done when the object is collected)."""
        if self._pool is not None:
            self.wait()
            self._finalizer()
            self._pool = None
