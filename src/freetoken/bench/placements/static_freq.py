"""``static-freq``: per layer the C most-routed experts of the first tokens on the GPU, the rest on the CPU.

The KTransformers-style baseline. During the first ``PROFILE_TOKENS`` tokens every expert runs on the CPU
while routing counts accumulate on the device; at the first safe point after that, each layer's
``C = S // L`` most-routed experts (ties: lower id) are made resident and locked for good.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.slot_backend import SlotBackend
from freetoken.experts.host_pool import HostExpertPool

PROFILE_TOKENS = 200


class StaticFreqBackend(SlotBackend):
    name = "static-freq"

    def __init__(
        self,
        config: EngineConfig,
        pool: HostExpertPool,
        device: torch.device,
        dtype: torch.dtype,
        profile_tokens: int = PROFILE_TOKENS,
    ) -> None:
        super().__init__(config, pool, device, dtype, with_cpu=True)
        self.per_layer = min(pool.num_experts, self.cache.num_slots // pool.num_layers)
        self.profile_tokens = profile_tokens
        self.tokens_seen = 0
        self.placed = False
        self.route_counts = torch.zeros(pool.num_rows, dtype=torch.long, device=device)  # [N]

    def begin_step(self, num_tokens: int, is_decode: bool) -> None:
        if not self.placed and self.tokens_seen >= self.profile_tokens:
            self.place()
        self.tokens_seen += num_tokens

    def resize_expert_cache(self, num_slots: int, fallback: Sequence[int] = ()) -> None:
        """Unlock, resize, then (once profiled) place each layer's ``C = S // L`` most-routed experts again."""
        self.cache.unlock(list(self.cache.resident()))
        super().resize_expert_cache(num_slots, fallback)
        self.per_layer = min(self.pool.num_experts, self.cache.num_slots // self.pool.num_layers)
        if self.placed:
            self.place()

    def place(self) -> None:
        """Make each layer's C most-routed experts resident and locked, nothing else (a safe point: may sync)."""
        L, E, C = self.pool.num_layers, self.pool.num_experts, self.per_layer
        self.placed = True
        if C == 0:
            self.cache.evict(list(self.cache.resident()))
            return
        counts = self.route_counts.view(L, E)
        key = counts * E + (E - 1 - torch.arange(E, device=counts.device))  # ties: lower expert id
        top = torch.topk(key, C, dim=1).indices + torch.arange(L, device=counts.device)[:, None] * E
        eids = top.reshape(-1)
        keep = set(eids.tolist())
        self.cache.evict([e for e in self.cache.resident() if e not in keep])
        self.cache.insert(eids)
        self.cache.lock(eids)

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        if not self.placed:
            eids = topk_ids.reshape(-1) + layer * self.pool.num_experts
            self.route_counts.index_add_(0, eids, torch.ones_like(eids))
        return self.split_forward(layer, x, topk_ids, topk_w)  # share stays 0, FROZEN: no fills

