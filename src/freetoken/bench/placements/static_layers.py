"""``static-layers``: whole layers' experts on the GPU until the slot budget is spent, the rest on the CPU.

The baseline of llama.cpp's ``--n-cpu-moe N``: the first layers' experts stay on the CPU, the last
``S // E`` layers are resident (locked) from the start. Nothing is ever filled or evicted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.slot_backend import SlotBackend
from freetoken.experts.host_pool import HostExpertPool


class StaticLayersBackend(SlotBackend):
    name = "static-layers"

    def __init__(self, config: EngineConfig, pool: HostExpertPool, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(config, pool, device, dtype, with_cpu=True)
        self.gpu_layers = 0
        self._place()

    def _place(self) -> None:
        """The last ``S // E`` layers resident and locked; nothing else."""
        L, E = self.pool.num_layers, self.pool.num_experts
        self.gpu_layers = min(L, self.cache.num_slots // E)
        first = L - self.gpu_layers
        eids = list(range(first * E, L * E))
        self.cache.evict([e for e in self.cache.resident() if e < first * E])
        if eids:
            self.cache.insert(eids)
            self.cache.lock(eids)

    def resize_expert_cache(self, num_slots: int, fallback: Sequence[int] = ()) -> None:
        """Whole layers again: unlock, resize (the newest layers' experts stay), then place ``S // E`` layers."""
        self.cache.unlock(list(self.cache.resident()))
        super().resize_expert_cache(num_slots, fallback)
        self._place()

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        return self.split_forward(layer, x, topk_ids, topk_w)  # share stays 0, FROZEN: no fills

