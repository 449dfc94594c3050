"""``offload``: every routed expert runs on the GPU; misses are copied into victim slots (``streaming_rule``).

A round fills as many misses as the slots this round does not read allow; when a step's misses exceed
them (a small cache, a long prefill chunk), further rounds serve the rest after the earlier rounds'
kernels (same stream), so every slot becomes a victim candidate again. The round count is a host
bound from shapes only: ceil(min(T*k, E) / S); rounds with nothing left do no work. Prefill steps of at
least ``stream_min_tokens`` tokens stream whole layers instead when the cache can spare two (``prefill/streamer.py``).
"""

from __future__ import annotations

import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.slot_backend import SlotBackend, streaming_rule
from freetoken.experts.host_pool import HostExpertPool
from freetoken.experts.slots.sizing import check_slots_cover_topk


class OffloadBackend(SlotBackend):
    name = "offload"

    def __init__(self, config: EngineConfig, pool: HostExpertPool, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(config, pool, device, dtype, with_cpu=False)
        self.rule = streaming_rule(pool.num_layers)

    def rounds(self, num_routes: int) -> int:
        distinct = min(num_routes, self.pool.num_experts)
        return -(-distinct // self.cache.num_slots)

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        if topk_ids.numel() == 0:
            return torch.zeros_like(x)
        check_slots_cover_topk(self.cache.num_slots, topk_ids.shape[1])
        streamed = self.streamed_forward(layer, x, topk_ids, topk_w)  # prefill: whole layers
        if streamed is not None:
            return streamed
        return self.graphed(layer, x, topk_ids, topk_w, self._fill_all)

    def _fill_all(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        plan = self.cache.group_and_plan(layer, topk_ids, self._one, self.rule, counters=self.counters)
        groups = plan.groups
        out = self._gpu(x, groups, plan, topk_w)
        self._count(layer, plan, True, False)
        rounds = self.rounds(topk_ids.numel())
        pending = groups.valid & (plan.slot < 0) if rounds > 1 else groups.valid
        for _ in range(1, rounds):
            plan = self.cache.plan(groups, pending, self._one, self.rule)
            out = out + self._gpu(x, groups, plan, topk_w)
            self._count(layer, plan, False, False)
            pending = pending & (plan.slot < 0)
        return out.to(x.dtype)


create = OffloadBackend.create  # the registry's factory
