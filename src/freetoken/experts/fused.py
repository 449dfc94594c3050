"""``fused``: every routed expert resident on the compute device (the pool fits in VRAM).

Small steps (decode) gather the routed experts' weights and run batched matmuls: fixed shapes, so on CUDA
each (layer, tokens) is replayed as a CUDA graph (``layer_graphs.py``, ``EngineConfig.moe_cuda_graphs``):
eager, the ~15 launches per layer made the host, not the GPU, set the pace (and the bandwidth model's
``T_gpu``, which ``ft bench decode`` takes from this backend).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.config import EngineConfig
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.layer_graphs import LayerGraphs
from freetoken.experts.reference import moe_reference

# Up to this many routes per step, gather the routed experts' weights and run one batched matmul
# (fixed shapes, no host synchronisation: the decode path); above it, loop over distinct experts.
_GATHER_MAX_ROUTES = 32


class FusedBackend(ExpertBackend):
    name = "fused"

    def __init__(self, banks: ExpertBanks, device: torch.device, dtype: torch.dtype, cuda_graphs: bool = False) -> None:
        self.num_experts = banks.num_experts
        self.gate_up = banks.gate_up.to(device=device, dtype=dtype)
        self.down = banks.down.to(device=device, dtype=dtype)
        self._hits = 0
        self.graphs = LayerGraphs(_GATHER_MAX_ROUTES) if cuda_graphs and device.type == "cuda" else None

    def forward(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor
    ) -> torch.Tensor:
        T, k = topk_ids.shape
        if T * k > _GATHER_MAX_ROUTES:
            return moe_reference(x, topk_ids + layer * self.num_experts, topk_w, self.gate_up, self.down)
        if self.graphs is not None and self.graphs.eligible(T):
            return self.graphs.run(layer, x, topk_ids, topk_w, self._gathered, self)
        return self._gathered(layer, x, topk_ids, topk_w)

    def _gathered(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        """Gather the routed experts' weights, two batched matmuls: fixed shapes, no host sync (capturable)."""
        rows = topk_ids + layer * self.num_experts  # [T, k] pool rows
        T, k = rows.shape
        flat = rows.reshape(-1)
        xs = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # [T*k, D, 1]
        gu = torch.bmm(self.gate_up[flat], xs).squeeze(-1)  # [T*k, 2I]
        gate, up = gu.chunk(2, dim=-1)
        h = (F.silu(gate) * up).unsqueeze(-1)  # [T*k, I, 1]
        y = torch.bmm(self.down[flat], h).squeeze(-1).float()  # [T*k, D]
        y = (y * topk_w.reshape(-1, 1).float()).view(T, k, -1).sum(dim=1)
        return y.to(x.dtype)

    # -- the graphs' host (``layer_graphs.GraphHost``): nothing to queue or count around a replay ----------
    def capture_begin(self) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def before_replay(self, layer: int, tokens: int) -> None:
        pass

    def replay_failed(self) -> None:
        pass

    def stats(self) -> dict[str, int | float]:
        return {} if self.graphs is None else dict(self.graphs.stats())


def create(config: EngineConfig, banks: ExpertBanks, device: torch.device, dtype: torch.dtype) -> FusedBackend:
    return FusedBackend(banks, device, dtype, cuda_graphs=config.moe_cuda_graphs)
