"""``fused``: every routed expert resident on the compute device (the pool fits in VRAM)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.reference import moe_reference

# Up to this many routes per step, gather the routed experts' weights and run one batched matmul
# (fixed shapes, no host synchronisation: the decode path); above it, loop over distinct experts.
_GATHER_MAX_ROUTES = 32


class FusedBackend(ExpertBackend):
    name = "fused"

    def __init__(self, banks: ExpertBanks, device: torch.device, dtype: torch.dtype) -> None:
        self.num_experts = banks.num_experts
        self.gate_up = banks.gate_up.to(device=device, dtype=dtype)
        self.down = banks.down.to(device=device, dtype=dtype)
        self._hits = 0

    def forward(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor
    ) -> torch.Tensor:
        rows = topk_ids + layer * self.num_experts  # [T, k] pool rows
        T, k = rows.shape
        if T * k > _GATHER_MAX_ROUTES:
            return moe_reference(x, rows, topk_w, self.gate_up, self.down)
        flat = rows.reshape(-1)
        xs = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # [T*k, D, 1]
        gu = torch.bmm(self.gate_up[flat], xs).squeeze(-1)  # [T*k, 2I]
        gate, up = gu.chunk(2, dim=-1)
        h = (F.silu(gate) * up).unsqueeze(-1)  # [T*k, I, 1]
        y = torch.bmm(self.down[flat], h).squeeze(-1).float()  # [T*k, D]
        y = (y * topk_w.reshape(-1, 1).float()).view(T, k, -1).sum(dim=1)
        return y.to(x.dtype)


def create(config: object, banks: ExpertBanks, device: torch.device, dtype: torch.dtype) -> FusedBackend:
    return FusedBackend(banks, device, dtype)
