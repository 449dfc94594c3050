"""The MoE layer: router on the compute device (softmax top-k, or DeepSeek-V3-style sigmoid routing with a correction
bias: ``kernels/route.py``), routed experts through ``experts/``, shared expert."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from freetoken.experts.base import ExpertBackend
from freetoken.kernels.route import SigmoidRouting, route, route_sigmoid, sigmoid_scores
from freetoken.layers.mlp import DenseMLP


class RouterOverride(Protocol):
    """Routes a MoE layer instead of its top-k (benchmarks install one on a built model: ``bench/routing_trace.py``).
    ``probs [T, E]`` is the router's float32 softmax (its sigmoid scores for sigmoid routing); returns (ids [T, k]
    int64, weights [T, k] float32)."""

    def route(self, layer: int, probs: torch.Tensor, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class MoELayer:
    router: torch.Tensor  # [E, D]
    top_k: int
    norm_topk_prob: bool
    moe_index: int  # this layer's index among MoE layers (eid = moe_index * E + expert)
    backend: ExpertBackend
    shared: DenseMLP | None = None
    shared_gate: torch.Tensor | None = None  # [1, D]: sigmoid gate on the shared expert
    router_override: RouterOverride | None = None  # set on a built model (benchmarks): routes instead of top-k
    sigmoid: SigmoidRouting | None = None  # DeepSeek-V3-style routing instead of softmax top-k
    bias: torch.Tensor | None = None  # [E] float32: its correction bias (read by the choice only)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (topk_ids [T, k] int64, topk_w [T, k] float32)."""
        sig = self.sigmoid
        if sig is not None:
            assert self.bias is not None
            if self.router_override is None:
                return route_sigmoid(x, self.router, self.bias, sig)
            scores = sigmoid_scores(F.linear(x.float(), self.router.float()), self.bias, sig)[0]
            ids, w = self.router_override.route(self.moe_index, scores, sig.norm_topk)
            return ids, w * sig.scale
        if self.router_override is not None:
            probs = F.softmax(F.linear(x, self.router), dim=-1, dtype=torch.float32)  # [T, E]
            ids, w = self.router_override.route(self.moe_index, probs, self.norm_topk_prob)
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
