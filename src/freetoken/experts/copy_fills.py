"""Slot fills through the copy engine (``EngineConfig.fill_copy_engine``, experimental): the alternative
to the gather kernel's SM loads over PCIe.

Per round of fills, on the compute stream: one kernel writes the plan's fill list ``[count, pool rows,
slots]`` into this layer's pinned list buffer (through its mapped view), then the stream writes a ready
flag; the C++ copy thread (``experts/cpu/copier``), which had the job queued before the GPU got there,
reads the list and issues ``cuMemcpyHtoDAsync`` per bank and fill on its own copy stream, then a stream
write of the done flag; the compute stream waits for it before the filled experts' GEMM (the hits' GEMM
runs beside the copies: ``SlotBackend._gpu``). The host never waits.
Replayed CUDA graphs use a toggle flag pair (as ``cpu_stream.py``): the graph writes ready = 1, waits
for done == 1 and resets it; ``push_replay`` queues a layer's jobs before each replay, as many as its
capture recorded.

Safety by stream order: the copier starts a layer's copies only after the compute stream reached the
ready flag, i.e. after every earlier kernel (earlier layers' GEMMs that read other slots) is done; victim
slots are never read by this step's hits; the GEMM starts after the done flag, which the copy stream
writes after its copies. A list buffer is rewritten only after the stream waited for its last job.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from freetoken.experts.cpu.copier import CopyJob, HostCopier, cuda_entry_points
from freetoken.experts.pool import HostExpertPool, mapped_device_view
from freetoken.experts.slot_plan import StepPlan
from freetoken.experts.stream_ops import StreamOps

MAX_STEPS_AHEAD = 2  # steps the host may queue ahead of the GPU (bound_runahead)


class CopyEngineFills:
    def __init__(
        self,
        pool: HostExpertPool,
        slot_banks: list[torch.Tensor],
        device: torch.device,
        ops: StreamOps,
        max_kv: int,
        spin_us: int = 50,
    ) -> None:
        L = pool.num_layers
        i32 = torch.int32
        self.ops, self.device, self.max_kv = ops, device, max_kv
        self.lists = torch.zeros((L, 1 + 2 * max_kv), dtype=torch.int64, pin_memory=True)
        self.mapped = mapped_device_view(self.lists, device)
        flags = [torch.zeros(1, dtype=i32, pin_memory=True) for _ in range(4)]
        self.ready, self.done, self.ready_t, self.done_t = flags
        self._ptr = {n: ops.device_ptr(getattr(self, n)) for n in ("ready", "done", "ready_t", "done_t")}
        self.stream = torch.cuda.Stream(device)
        self.copier = HostCopier(spin_us)
        self.copier.configure([pool.gate_up, pool.down], slot_banks, self.stream.cuda_stream, cuda_entry_points())
        self.seq = 0
        self._jobs: dict[tuple[int, int], CopyJob] = {}  # (layer, kv) -> checked job arguments
        self._toggle: dict[tuple[int, int], CopyJob] = {}
        # (layer, routes T*k) -> the kv of each fill round the graph of that key holds
        self.captured: dict[tuple[int, int], list[int]] = {}
        self.jobs = 0
        self._steps: deque[torch.cuda.Event] = deque()  # end-of-step marks (bound_runahead)

    def bound_runahead(self, steps: int = MAX_STEPS_AHEAD) -> None:
        """At a step boundary: sleep until the step ``steps`` back is done. A host that runs further ahead
        fills the driver's launch queue and then blocks inside a launch, holding the driver lock the copy
        thread needs for its copies, which the queued work waits for: a deadlock (seen on the GPU box in
        graphed decode). An engine that waits for each step's token never gets there; a benchmark can."""
        ev = torch.cuda.Event(blocking=True)  # sleeps, leaving the cores to the CPU branch
        ev.record()
        self._steps.append(ev)
        while len(self._steps) > steps:
            self._steps.popleft().synchronize()

    def _list(self, layer: int, kv: int) -> torch.Tensor:
        return self.lists[layer, : 1 + 2 * kv]

    def copy(self, layer: int, plan: StepPlan) -> Callable[[], None]:
        """Start the round's fills from the current stream (see the module docstring); returns the stream's
        wait for them, to enqueue before anything reads the filled slots (work between runs beside the copies)."""
        from freetoken.experts.triton_copy import stage_fill_list_triton

        kv = plan.copy_src.numel()
        if kv > self.max_kv:
            raise ValueError(f"{kv} fills exceed the list buffers ({self.max_kv})")
        stage_fill_list_triton(plan.copy_count, plan.copy_src, plan.copy_dst, self.mapped[layer, : 1 + 2 * kv])
        ops, p = self.ops, self._ptr
        if torch.cuda.is_current_stream_capturing():
            self.captured.setdefault((layer, plan.route_code.numel()), []).append(kv)
            ops.write(p["ready_t"], 1)

            def wait_toggle() -> None:
                ops.wait(p["done_t"], 1, equal=True)
                ops.write(p["done_t"], 0)

            return wait_toggle
        self.seq = (self.seq + 1) & 0xFFFFFFFF or 1
        job = self._jobs.get((layer, kv))
        if job is None:
            job = HostCopier.job(self.ready, 0, self._list(layer, kv), self.done, 0, done_dev=p["done"])
            self._jobs[(layer, kv)] = job
        seq = self.seq
        ops.write(p["ready"], seq)
        self.copier.push(job, seq, seq)
        self.jobs += 1
        return lambda: ops.wait(p["done"], seq)

    def push_replay(self, layer: int, routes: int) -> None:
        """Queue the fill rounds the captured graph of (layer, routes) is about to run (right before its replay)."""
        for kv in self.captured.get((layer, routes), ()):
            job = self._toggle.get((layer, kv))
            if job is None:
                job = HostCopier.job(self.ready_t, 1, self._list(layer, kv), self.done_t, 1,
                                     done_dev=self._ptr["done_t"], toggle=True)  # fmt: skip
                self._toggle[(layer, kv)] = job
            self.copier.push(job)
            self.jobs += 1

    def cancel_replay(self) -> None:
        """A replay failed after ``push_replay``: release its queued jobs with empty lists (nothing is copied:
        a stale list could overwrite slots the tables gave to other experts since) and re-arm the toggle pair."""
        self.lists[:, 0] = 0
        self.ready_t[0] = 1
        self.copier.drain()
        self.ready_t[0], self.done_t[0] = 0, 0

    def forget_captures(self) -> None:
        self.captured.clear()

    def check(self) -> None:
        """Raise when a copy job failed (call at a safe point)."""
        err = self.copier.error()
        if err is not None:
            raise RuntimeError(f"a copy-engine fill failed: {err}")

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        self.copier.drain()
        self.copier.close()

    def stats(self) -> dict[str, Any]:
        return {"fill_jobs": self.jobs, "fill_memcpys": self.copier.copies()}
