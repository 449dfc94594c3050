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
    router_bias: torch.Tensor | None = None  # [E] (gpt-oss)
    down_bias: torch.Tensor | None = None  # [E, D] the experts' down_proj biases (gpt-oss), added here once per route

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
            probs = F.softmax(F.linear(x, self.router, self.router_bias), dim=-1, dtype=torch.float32)  # [T, E]
            ids, w = self.router_override.route(self.moe_index, probs, self.norm_topk_prob)
            return ids, w.to(x.dtype).to(torch.float32)
        return route(x, self.router, self.top_k, self.norm_topk_prob, self.router_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, w = self.route(x)
        out = self.backend.forward(self.moe_index, x, ids, w)
        if self.down_bias is not None:
            out = out + routed_down_bias(self.down_bias, ids, w).to(out.dtype)
        if self.shared is not None:
            s, logit = self.shared.forward_with_extra(x)  # the gate's logit from the shared input GEMM when fused
            if self.shared_gate is None:
                return out + s
            gate = torch.sigmoid(logit if logit is not None else F.linear(x, self.shared_gate))
            return torch.addcmul(out, gate, s)  # out + gate * s in one launch
        return out


def routed_down_bias(down_bias: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_j w[t, j] * down_bias[ids[t, j]] -> [T, D] float32: each routed expert's down bias, weighted as its
    output is. Added here, outside the backends, it is counted once per route whichever branch ran the expert (the
    partial sums of the GPU and CPU branches stay bias-free and still add up exactly)."""
    return (down_bias[ids].float() * w.float()[..., None]).sum(dim=1)

