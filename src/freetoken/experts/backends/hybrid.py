"""``hybrid``: of each layer's m misses, q are filled into slots and run on the GPU, m - q run on the CPU.

``q = clamp(ceil((m+1) * share) - 1, 1, m)`` on the device (the whole fills that end the later branch first:
``slots/plan.py: fill_quota``), capped by the slots this step does not read; victims by ``streaming_rule``
(recent slots last: blocking them outright would push misses to the CPU beyond the balanced split,
``bench/cache_sim.py`` compares both). The share comes from ``SplitPolicy`` (fill_fraction, machine profile,
online refinement); prefill steps of at least ``stream_min_tokens`` tokens stream whole layers when the cache can
spare two (``experts/prefill/streamer.py``), else use share 1; shorter prefill steps (a warm prompt's new suffix)
split like decode. Branch bandwidths are measured without host syncs: the
CPU worker times itself; on CUDA the fills are bracketed by events whose times (and q, copied to pinned
memory) are read at the next ``begin_step`` once done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.slot_backend import SlotBackend, streaming_rule
from freetoken.experts.backends.split_policy import SplitPolicy, load_machine_profile
from freetoken.experts.host_pool import HostExpertPool
from freetoken.experts.prefill.streamer import stream_min_tokens
from freetoken.experts.slots.plan import StepPlan

_MAX_PENDING_RECORDS = 4096
COPY_TIMING_EVERY = 4  # time one fill round in this many on CUDA (events cost host time every layer)


@dataclass
class _CopyRecord:
    start: torch.cuda.Event
    end: torch.cuda.Event
    q: torch.Tensor  # [] view of the pinned ring: the host copy of copy_count


class HybridBackend(SlotBackend):
    name = "hybrid"
    partly_pinned_ok = True

    def __init__(
        self,
        config: EngineConfig,
        pool: HostExpertPool,
        device: torch.device,
        dtype: torch.dtype,
        profile: dict[str, object] | None = None,
    ) -> None:
        super().__init__(config, pool, device, dtype, with_cpu=True)
        prof = profile if profile is not None else load_machine_profile()
        self.policy = SplitPolicy.create(config.fill_fraction, prof)
        self.share.fill_(self.policy.share)
        self._published = self.policy.share
        self.rule = streaming_rule(pool.num_layers, pool.pinned_rows if pool.partly_pinned else None)
        self._decode = True
        self._records: list[_CopyRecord] = []
        self._copy_calls, self._timed = 0, 0
        # Pinned landing places for the timed rounds' q, allocated once: a pinned allocation per layer
        # (cudaHostAlloc) can wait for the device, which would stop the host from running ahead.
        # Records fold in stream order and stay fewer than the ring, so a slot is free when reused.
        self._q_ring = torch.zeros(_MAX_PENDING_RECORDS, dtype=torch.long, pin_memory=device.type == "cuda")
        self._copy_bytes, self._copy_s, self._cpu_bytes, self._cpu_s = 0, 0.0, 0, 0.0

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        streamed = self.streamed_forward(layer, x, topk_ids, topk_w)  # prefill: whole layers
        if streamed is not None:
            return streamed
        return self.split_forward(layer, x, topk_ids, topk_w)

    def begin_step(self, num_tokens: int, is_decode: bool) -> None:
        """Safe point: fold finished measurements into the split and publish this step's share.

        Long prefill steps fill every miss that fits (share 1): many tokens per expert make the CPU branch
        compute-bound, while a copied expert serves them all on the GPU. Below ``stream_min_tokens`` a prefill step
        has few tokens per expert: it splits like decode. A fixed fill_fraction holds always.
        """
        super().begin_step(num_tokens, is_decode)
        self._decode = is_decode
        self._fold_copy_records()
        if self._copy_bytes or self._cpu_bytes:
            self.policy.observe(self._copy_bytes, self._copy_s, self._cpu_bytes, self._cpu_s)
            self._copy_bytes, self._copy_s, self._cpu_bytes, self._cpu_s = 0, 0.0, 0, 0.0
        long_prefill = not is_decode and num_tokens >= stream_min_tokens(self.pool.num_experts, self.pool.banks.top_k)
        share = 1.0 if long_prefill and not self.policy.fixed else self.policy.share
        if share != self._published:
            self.share.fill_(share)
            self._published = share

    def _copy(self, plan: StepPlan) -> None:
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            self.cache.copy(plan)
            self._copy_s += time.perf_counter() - t0
            self._copy_bytes += int(plan.copy_count) * self.pool.expert_bytes  # no sync on the CPU device
            return
        self._copy_calls += 1
        untimed = self._copy_calls % COPY_TIMING_EVERY or len(self._records) >= _MAX_PENDING_RECORDS
        if untimed or torch.cuda.is_current_stream_capturing():  # graphs replay without host records
            self.cache.copy(plan)
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._timed += 1
        q = self._q_ring[self._timed % _MAX_PENDING_RECORDS]
        start.record()
        self.cache.copy(plan)
        # a plain copy, no arithmetic: a kernel's first launch may load its module, which waits for the GPU
        q.copy_(plan.copy_count, non_blocking=True)  # before `end`: done when `end` is
        end.record()
        self._records.append(_CopyRecord(start, end, q))

    def _fold_copy_records(self) -> None:
        keep: list[_CopyRecord] = []
        for r in self._records:
            if not r.end.query():  # not finished: never wait for it
                keep.append(r)
                continue
            self._copy_s += r.start.elapsed_time(r.end) / 1e3
            self._copy_bytes += int(r.q) * self.pool.expert_bytes
        self._records = keep

    def _after_cpu(self, experts: int, seconds: float) -> None:
        if not self._decode:  # prefill CPU work is compute-bound: not the bandwidth the split needs
            return
        self._cpu_bytes += experts * self.pool.expert_bytes
        self._cpu_s += seconds

    def stats(self) -> dict[str, int | float]:
        s = super().stats()
        s["share"] = self.policy.share
        s["b_copy_online"] = self.policy.b_copy or 0.0  # GB/s, smoothed branch measurements
        s["b_cpu_online"] = self.policy.b_cpu or 0.0
        return s


create = HybridBackend.create  # the registry's factory
