"""The CPU expert branch ordered by the CUDA stream itself (DESIGN §7 step 3): the engine thread never
waits for it.

Per MoE layer: one staging kernel writes the hidden states, route codes and gate weights into this
layer's pinned buffers through their mapped device views (no copy-engine operation), then the stream
writes the step's sequence number into a pinned ``ready`` flag (``cuStreamWriteValue32``); the C++
kernel's feeder thread, which had the batch queued before the GPU got there, starts it when the flag is
reached, writes the partial into the layer's pinned ``out`` buffer and sets the ``done`` flag; the stream
waits for ``done`` (``cuStreamWaitValue32``) and the caller's add reads the partial from its pinned buffer
(zero-copy). The host only enqueues: it can queue every MoE layer of a step while the GPU still works on
the first. Kernel writes to mapped host memory are complete when the kernel is, so the ready flag written
after it in stream order still follows them; the CPU's writes are seen by device reads after the done
flag (coherent PCIe).

Inside a CUDA graph capture (``backends/layer_graphs.py``) the stream operations use a second flag pair in toggle
mode (the graph writes ready = 1, waits for done == 1, resets done = 0: replays repeat fixed values) and
nothing is queued at capture; ``push_replay`` queues the layer's batch before each replay.

Buffer reuse is safe by stream order: a layer's next inputs are staged after the stream waited for its
previous batch, and the CPU writes a layer's ``out`` only after the ready flag that follows the previous
add. Branch timings come from the feeder's per-layer stats, read at the next step's safe point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from freetoken.experts.cpu.kernel import CpuExpertKernel, PreparedBatches
from freetoken.experts.cpu.stream_ops import StreamOps
from freetoken.experts.host_pool import HostExpertPool, mapped_device_view


@dataclass
class StreamedHandle:
    layer: int
    seq: int
    tokens: int


def _reached(flag: int, value: int) -> bool:
    """The feeder's cyclic compare: (int32)(flag - value) >= 0."""
    d = (flag - value) & 0xFFFFFFFF
    return d < 0x80000000


class StreamedCpuBranch:
    def __init__(
        self,
        kernel: CpuExpertKernel,
        pool: HostExpertPool,
        ops: StreamOps,
        device: torch.device,
        max_tokens: int,
        top_k: int,
    ) -> None:
        L, D = pool.num_layers, pool.banks.hidden_size
        self.kernel, self.pool, self.ops, self.device = kernel, pool, ops, device
        self.max_tokens, self.top_k = max_tokens, top_k
        f32, i64, i32 = torch.float32, torch.int64, torch.int32
        self.x = torch.zeros((L, max_tokens, D), dtype=f32, pin_memory=True)
        self.codes = torch.zeros((L, max_tokens * top_k), dtype=i64, pin_memory=True)
        self.w = torch.zeros((L, max_tokens * top_k), dtype=f32, pin_memory=True)
        self.out = torch.zeros((L, max_tokens, D), dtype=f32, pin_memory=True)
        # the same buffers as CUDA tensors (UVA), written and read by kernels over PCIe
        self.mapped = tuple(mapped_device_view(b, device) for b in (self.x, self.codes, self.w, self.out))
        # per layer: distinct rows, routes, ns, error (see FtQueuedArgs::stats)
        self.stats = torch.zeros((L, 4), dtype=i64)  # written by the feeder, read here
        self.stats_t = torch.zeros((L, 4), dtype=i64)  # the same for batches of replayed graphs
        self.ready = torch.zeros(1, dtype=i32, pin_memory=True)
        self.done = torch.zeros(1, dtype=i32, pin_memory=True)
        self._ready_ptr, self._done_ptr = ops.device_ptr(self.ready), ops.device_ptr(self.done)
        self.ready_t = torch.zeros(1, dtype=i32, pin_memory=True)  # toggle pair for captured graphs
        self.done_t = torch.zeros(1, dtype=i32, pin_memory=True)
        self._ready_t_ptr, self._done_t_ptr = ops.device_ptr(self.ready_t), ops.device_ptr(self.done_t)
        self._toggle_args: list[Any] = [None] * L
        self._steps: dict[tuple[tuple[int, int], ...], PreparedBatches] = {}  # push_replay_many's, per step shape
        self._replayed: set[int] = set()  # layers queued by push_replay since the last collect
        self.seq = 0
        self._last = [0] * L  # sequence number of each layer's latest batch
        self._read = [0] * L  # ... whose stats were collected
        self._args: list[Any] = [None] * L  # per layer: the kernel's checked arguments, re-queued cheaply

    def fits(self, tokens: int, top_k: int) -> bool:
        return 0 < tokens <= self.max_tokens and top_k == self.top_k

    def submit(self, layer: int, x: torch.Tensor, codes: torch.Tensor, topk_w: torch.Tensor) -> StreamedHandle:
        """Enqueue the layer's CPU branch (x [T, D], codes [T*k], topk_w [T, k] on the GPU); no host wait."""
        T, k = topk_w.shape
        xs, cs, ws, out = self.x[layer, :T], self.codes[layer, : T * k], self.w[layer, : T * k], self.out[layer, :T]
        from freetoken.experts.cpu.stage_triton import stage_inputs_triton  # CUDA only: Triton is there

        xm, cm, wm, _ = self.mapped  # one kernel writes all three through the mapped views
        stage_inputs_triton(x.contiguous(), codes.reshape(-1).contiguous(), topk_w.reshape(-1).contiguous(),
                            xm[layer, :T], cm[layer, : T * k], wm[layer, : T * k])  # fmt: skip
        if torch.cuda.is_current_stream_capturing():
            if self._args[layer] is None:
                raise RuntimeError("capture a layer's CPU branch only after one eager call")
            self.ops.write(self._ready_t_ptr, 1)  # toggle: the batch is queued at each replay
            return StreamedHandle(layer, 0, T)
        self.seq = (self.seq + 1) & 0xFFFFFFFF or 1
        seq = self.seq
        self.ops.write(self._ready_ptr, seq)  # after the copies, in stream order
        try:
            if self._args[layer] is None:  # checked once per layer (its buffers hold max_tokens rows)
                self._args[layer] = self.kernel.enqueue(
                    xs, cs, ws, self.pool.gate_up, self.pool.down, out,
                    ready=(self.ready, seq), done=(self.done, seq), stats=self.stats[layer],
                    activation=self.pool.activation, scales=self.pool.scales, bias=self.pool.gate_up_bias)  # fmt: skip
            else:
                self.kernel.enqueue_prepared(self._args[layer], T, seq, seq)
        except Exception:
            self.kernel.drain()  # earlier batches finish (their flags are in the stream) ...
            self.done[0] = seq  # ... then release the wait this layer's caller will enqueue
            raise
        self._last[layer] = seq
        return StreamedHandle(layer, seq, T)

    def wait(self, h: StreamedHandle) -> torch.Tensor:
        """The stream waits for the batch; its float32 partial [T, D] as a mapped view of the pinned buffer
        (valid in stream order until the layer's next batch)."""
        if h.seq == 0:  # captured: toggle flags
            self.ops.wait(self._done_t_ptr, 1, equal=True)
            self.ops.write(self._done_t_ptr, 0)
        else:
            self.ops.wait(self._done_ptr, h.seq)
        return self.mapped[3][h.layer, : h.tokens]

    def push_replay(self, layer: int, tokens: int) -> None:
        """Queue the batch a captured layer's graph is about to start (call right before its replay)."""
        self.kernel.enqueue_prepared(self._toggle(layer), tokens, 1, 1)
        self._replayed.add(layer)

    def push_replay_many(self, items: Sequence[tuple[int, int]]) -> None:
        """Queue the batches of a captured step's layers ((layer, tokens), in layer order) in one kernel call,
        right before the step's replay."""
        key = tuple(items)
        batch = self._steps.get(key)
        if batch is None:
            batch = PreparedBatches([self._toggle(layer) for layer, _ in key], [t for _, t in key])
            self._steps[key] = batch
        self.kernel.enqueue_many(batch)
        self._replayed.update(layer for layer, _ in key)

    def _toggle(self, layer: int) -> Any:
        """The layer's batch on the toggle flags (ready = done = 1: the values a replayed graph writes)."""
        args = self._toggle_args[layer]
        if args is None:
            args = self.kernel.toggle_flags(self._args[layer], self.ready_t, self.done_t, self.stats_t[layer])
            args.ready_value = args.done_value = 1
            self._toggle_args[layer] = args
        return args

    def cancel_replay(self) -> None:
        """A replay failed after ``push_replay``: release its queued batch and re-arm the toggle pair."""
        self.ready_t[0] = 1  # the batch runs (on stale inputs; nobody reads its output)
        self.kernel.drain()
        self.ready_t[0], self.done_t[0] = 0, 0

    def close(self) -> None:
        """Let every queued batch finish (each one's ready flag is in the stream): call before the kernel
        and the pool go away."""
        torch.cuda.synchronize(self.device)
        self.kernel.drain()

    def collect(self) -> tuple[int, float]:
        """(distinct experts, seconds) over finished batches not collected yet. Raises when a batch failed."""
        err = self.kernel.queue_error()
        if err is not None:
            raise RuntimeError(f"the CPU expert branch failed: {err}")
        done = int(self.done[0])  # pinned host memory: no device sync
        experts, seconds = 0, 0.0
        for layer, seq in enumerate(self._last):
            if seq and seq != self._read[layer] and _reached(done, seq):
                st = self.stats[layer].tolist()
                experts, seconds = experts + st[0], seconds + st[2] / 1e9
                self._read[layer] = seq
        if self._replayed and self.kernel.queued() == 0:  # replayed batches: all done, stats final
            for layer in self._replayed:
                st = self.stats_t[layer].tolist()
                experts, seconds = experts + st[0], seconds + st[2] / 1e9
            self._replayed.clear()
        return experts, seconds
