"""``cpu``: every routed expert runs on the CPU from the host pool (no expert ever goes to the GPU)."""

from __future__ import annotations

import torch

from freetoken.config import EngineConfig
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.cpu.runner import CpuExpertRunner
from freetoken.experts.host_pool import HostExpertPool
from freetoken.experts.slots.counters import DeviceCounters
from freetoken.experts.slots.plan import group_routes


class CpuBackend(ExpertBackend):
    name = "cpu"

    def __init__(self, config: EngineConfig, pool: HostExpertPool, device: torch.device, dtype: torch.dtype) -> None:
        self.pool = pool
        self.device = device
        self.runner = CpuExpertRunner(pool, device, config.cpu_threads)
        self.counters = DeviceCounters(device, pool.num_layers)
        self._zero = torch.zeros((), dtype=torch.long, device=device)

    def begin_step(self, num_tokens: int, is_decode: bool) -> None:
        self.runner.collect()  # reports a failed streamed batch of the last step

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        if topk_ids.numel() == 0:
            return torch.zeros_like(x)
        eids = topk_ids.reshape(-1) + layer * self.pool.num_experts  # [T*k] pool rows
        handle = self.runner.submit(x, -1 - eids, topk_w, layer)
        groups = group_routes(eids, self.pool.num_rows)  # distinct experts, counted on the device
        n = groups.n_groups
        self.counters.add_step(layer, self._zero, n, self._zero, n)
        out, _ = self.runner.wait(handle)
        # copy=True: a streamed batch's ``out`` is the layer's pinned buffer, rewritten by its next batch
        return out.to(x.dtype, copy=True)

    def stats(self) -> dict[str, int | float]:
        return self.counters.expert_stats(self.pool.expert_bytes, slots=0)  # no hits, no fills

    def layer_counts(self) -> dict[str, list[int]]:
        """Cumulative misses, fills (none) and CPU runs per MoE layer; one sync."""
        return self.counters.read_layers()

    def close(self) -> None:
        self.runner.close()
        self.pool.close()


def create(config: EngineConfig, banks: ExpertBanks, device: torch.device, dtype: torch.dtype) -> CpuBackend:
    # The CPU reads the pool in place: no pinning needed.
    return CpuBackend(config, HostExpertPool(banks, dtype=dtype, pin=False), device, dtype)
