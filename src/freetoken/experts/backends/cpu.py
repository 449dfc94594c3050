"""``cpu``: every routed expert runs on the CPU from the host pool (no expert ever goes to the GPU).

On CUDA a decode layer's CPU branch is stream-ordered (``experts/cpu/streamed.py``), so the layer is capturable as
the slot backends' layers are: one graph per (layer, tokens) (``layer_graphs.py``), and the engine's whole-step graph
with every layer's CPU batch queued in one call before each replay (``CpuBranchHost``).
"""

from __future__ import annotations

import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.layer_graphs import CpuBranchHost, LayerGraphs
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.cpu.runner import STREAMED_MAX_TOKENS, CpuExpertRunner
from freetoken.experts.host_pool import HostExpertPool
from freetoken.experts.slots.counters import DeviceCounters
from freetoken.experts.slots.plan import group_routes


class CpuBackend(CpuBranchHost, ExpertBackend):
    name = "cpu"
    cpu: CpuExpertRunner

    def __init__(self, config: EngineConfig, pool: HostExpertPool, device: torch.device, dtype: torch.dtype) -> None:
        self.pool = pool
        self.device = device
        self.cpu = CpuExpertRunner(pool, device, config.cpu_threads)
        self.counters = DeviceCounters(device, pool.num_layers)
        self._zero = torch.zeros((), dtype=torch.long, device=device)
        cuda_graphs = config.moe_cuda_graphs and device.type == "cuda"
        self.graphs = LayerGraphs(STREAMED_MAX_TOKENS) if cuda_graphs else None
        self._decode = True

    @property
    def cpu_busy_in_step(self) -> bool:
        return True  # the engine thread sleeps on the device, leaving the cores to the branch

    def begin_step(self, num_tokens: int, is_decode: bool) -> None:
        self._decode = is_decode
        self.cpu.collect()  # reports a failed streamed batch of the last step

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        if topk_ids.numel() == 0:
            return torch.zeros_like(x)
        g, T = self.graphs, x.shape[0]
        if g is None or not self._decode or not g.eligible(T) or not self.cpu.can_capture(T, topk_ids.shape[1]):
            return self._body(layer, x, topk_ids, topk_w)
        return g.run(layer, x, topk_ids, topk_w, self._body, self)

    def _body(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        eids = topk_ids.reshape(-1) + layer * self.pool.num_experts  # [T*k] pool rows
        handle = self.cpu.submit(x, -1 - eids, topk_w, layer)
        groups = group_routes(eids, self.pool.num_rows)  # distinct experts, counted on the device
        n = groups.n_groups
        self.counters.add_step(layer, self._zero, n, self._zero, n)
        out, _ = self.cpu.wait(handle)
        # copy=True: a streamed batch's ``out`` is the layer's pinned buffer, rewritten by its next batch
        return out.to(x.dtype, copy=True)

    def step_capturable(self, tokens: int, top_k: int) -> bool:
        g = self.graphs
        return g is not None and g.eligible(tokens) and self.cpu.can_capture(tokens, top_k)

    def stats(self) -> dict[str, int | float]:
        graphs = self.graphs.stats() if self.graphs is not None else {}
        return {**self.counters.expert_stats(self.pool.expert_bytes, slots=0), **graphs}  # no hits, no fills

    def layer_counts(self) -> dict[str, list[int]]:
        """Cumulative misses, fills (none) and CPU runs per MoE layer; one sync."""
        return self.counters.read_layers()

    def close(self) -> None:
        self.cpu.close()
        self.pool.close()


def create(config: EngineConfig, banks: ExpertBanks, device: torch.device, dtype: torch.dtype) -> CpuBackend:
    # The CPU reads the pool in place: no pinning needed.
    return CpuBackend(config, HostExpertPool(banks, dtype=dtype, pin=False), device, dtype)
