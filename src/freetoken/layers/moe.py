"""The MoE layer: router on the compute device, routed experts through ``experts/``, shared expert."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.experts.base import ExpertBackend
from freetoken.kernels.route import route
from freetoken.layers.mlp import DenseMLP
from freetoken.layers.routing_trace import RoutingTrace


@dataclass
class MoELayer:
    router: torch.Tensor  # [E, D]
    top_k: int
    norm_topk_prob: bool
    moe_index: int  # this layer's index among MoE layers (eid = moe_index * E + expert)
    backend: ExpertBackend
    shared: DenseMLP | None = None
    shared_gate: torch.Tensor | None = None  # [1, D]: sigmoid gate on the shared expert
    trace: RoutingTrace | None = None  # benchmarks only: route by a recorded trace

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (topk_ids [T, k] int64, topk_w [T, k] float32)."""
        if self.trace is not None:
            probs = F.softmax(F.linear(x, self.router), dim=-1, dtype=torch.float32)  # [T, E]
            ids, w = self.trace.route(self.moe_index, probs, self.norm_topk_prob)
            return ids, w.to(x.dtype).to(torch.float32)
        return route(x, self.router, self.top_k, self.norm_topk_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, w = self.route(x)
        out = self.backend.forward(self.moe_index, x, ids, w)
        if self.shared is not None:
            s = self.shared.forward(x)
            if self.shared_gate is not None:
                s = torch.sigmoid(F.linear(x, self.shared_gate)) * s
            out = out + s
        return out

