"""``static-layers``: whole layers' experts on the GPU until the slot budget is spent, the rest on the CPU.

The baseline of llama.cpp's ``--n-cpu-moe N``: the first layers' experts stay on the CPU, the last
``S // E`` layers are resident (locked) from the start. Nothing is ever filled or evicted.
"""

from __future__ import annotations

import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.slot_backend import SlotBackend
from freetoken.experts.host_pool import HostExpertPool


class StaticLayersBackend(SlotBackend):
    name = "static-layers"

    def __init__(self, config: EngineConfig, pool: HostExpertPool, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(config, pool, device, dtype, with_cpu=True)
        L, E = pool.num_layers, pool.num_experts
        self.gpu_layers = min(L, self.cache.num_slots // E)
        first = L - self.gpu_layers
        eids = list(range(first * E, L * E))
        if eids:
            self.cache.insert(eids)
            self.cache.lock(eids)

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        return self.split_forward(layer, x, topk_ids, topk_w)  # share stays 0, FROZEN: no fills


create = StaticLayersBackend.create  # the registry's factory
