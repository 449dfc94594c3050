"""The MoE layer: router on the compute device, routed experts through ``experts/``, shared expert."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from freetoken.experts.base import ExpertBackend
from freetoken.experts.triton_support import triton_available
from freetoken.layers import cpu_step
from freetoken.layers.mlp import DenseMLP


class RouterOverride(Protocol):
    """Routes a MoE layer instead of its top-k (benchmarks install one on a built model: ``bench/routing_trace.py``).
    ``probs [T, E]`` is the router's float32 softmax; returns (ids [T, k] int64, weights [T, k] float32)."""

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

    def __post_init__(self) -> None:
        self.router16 = cpu_step.bf16_copy(self.router)  # float32 CPU decode steps on a bf16 checkpoint

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (topk_ids [T, k] int64, topk_w [T, k] float32)."""
        if self.router_override is not None:
            probs = F.softmax(F.linear(x, self.router), dim=-1, dtype=torch.float32)  # [T, E]
            ids, w = self.router_override.route(self.moe_index, probs, self.norm_topk_prob)
            return ids, w.to(x.dtype).to(torch.float32)
        if x.is_cuda and triton_available():
            from freetoken.layers.router_triton import ONE_LAUNCH_TOKENS, route_linear_triton, route_triton

            if 0 < x.shape[0] <= ONE_LAUNCH_TOKENS:  # decode: the router's GEMM in the same launch
                return route_linear_triton(x, self.router, self.top_k, self.norm_topk_prob)
            return route_triton(F.linear(x, self.router), self.top_k, self.norm_topk_prob, x.dtype)
        logits = cpu_step.linear(x, self.router, self.router16)
        if cpu_step.available(logits):  # float32 on a CPU: one C++ call
            return cpu_step.route(logits, self.top_k, self.norm_topk_prob)
        return route_reference(logits, self.top_k, self.norm_topk_prob, x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, w = self.route(x)
        out = self.backend.forward(self.moe_index, x, ids, w)
        if self.shared is not None:
            s = self.shared.forward(x)
            if self.shared_gate is not None:
                s = torch.sigmoid(F.linear(x, self.shared_gate)) * s
            out = out + s
        return out


def route_reference(
    logits: torch.Tensor, top_k: int, norm_topk: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (ids [T, k] int64, weights [T, k] float32): softmax in float32, top-k, renormalised
    when the model says so; the weights rounded to the activation dtype, as the reference casts them before use."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    w, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk:
        w = w / w.sum(dim=-1, keepdim=True)
    return ids, w.to(dtype).to(torch.float32)
