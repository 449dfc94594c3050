"""The router's one dispatch point: hidden rows -> (top-k expert ids, their weights). On CUDA the router's GEMM,
softmax and top-k in one Triton launch at decode sizes (after ``F.linear`` at others; ``router_triton.py``); on a CPU
in float32 the softmax + top-k in one C++ call (``cpu_step.route``); ``route_reference`` elsewhere and as their
reference. T = tokens, E = experts, k = experts per token. DeepSeek-V3-style sigmoid routing with a correction bias
and group limits (``SigmoidRouting``) runs its torch path on every device (``route_sigmoid``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.kernels import cpu_step
from freetoken.kernels.linear import linear
from freetoken.kernels.triton_support import use_triton


def route(
    x: torch.Tensor, router: torch.Tensor, top_k: int, norm_topk: bool, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D], router [E, D] (and its bias [E], gpt-oss) -> (ids [T, k] int64, weights [T, k] float32), as
    ``route_reference`` of ``F.linear(x, router, bias)``. (gpt-oss's softmax over the top-k logits is the top-k of the
    softmax renormalised: ``norm_topk``.)"""
    if use_triton(x):
        from freetoken.kernels.router_triton import ONE_LAUNCH_TOKENS, route_linear_triton, route_triton

        if 0 < x.shape[0] <= ONE_LAUNCH_TOKENS and bias is None:  # decode: the router's GEMM in the same launch
            return route_linear_triton(x, router, top_k, norm_topk)
        return route_triton(F.linear(x, router, bias), top_k, norm_topk, x.dtype)
    logits = linear(x, router, bias)
    if cpu_step.available(logits):  # float32 on a CPU: one C++ call
        return cpu_step.route(logits, top_k, norm_topk)
    return route_reference(logits, top_k, norm_topk, x.dtype)


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


@dataclass(frozen=True)
class SigmoidRouting:
    """DeepSeek-V3-style routing (GLM-4.5 to 4.7, MiniMax-M2, DeepSeek-V3): sigmoid scores; the experts chosen by
    score + correction bias, only inside the ``topk_group`` of ``n_group`` equal groups with the highest group
    score (the sum of a group's two highest biased scores); their weights the unbiased scores, renormalised when
    ``norm_topk``, times ``scale`` (``routed_scaling_factor``). ``n_group == 1``: no group limit (MiniMax-M2)."""

    top_k: int
    norm_topk: bool
    n_group: int = 1
    topk_group: int = 1
    scale: float = 1.0


def route_sigmoid(
    x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor, spec: SigmoidRouting
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D], router [E, D], bias [E] float32 -> (ids [T, k] int64, weights [T, k] float32). The router's GEMM in
    float32 as the reference models compute it. Every device runs the torch path (no Triton or C++ kernel yet):
    fixed shapes, no host synchronisation, so it is captured in the step's CUDA graph like the rest of the layer."""
    return route_sigmoid_reference(F.linear(x.float(), router.float()), bias, spec)


def sigmoid_scores(logits: torch.Tensor, bias: torch.Tensor, spec: SigmoidRouting) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (scores [T, E] float32, the biased scores the choice reads [T, E], -inf outside the
    chosen groups)."""
    scores = logits.float().sigmoid()
    choice = scores + bias
    if spec.n_group > 1 and spec.topk_group < spec.n_group:
        T, E = choice.shape
        grouped = choice.view(T, spec.n_group, E // spec.n_group)
        group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(spec.topk_group, dim=-1).indices, True)
        choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(T, E)
    return scores, choice


def route_sigmoid_reference(
    logits: torch.Tensor, bias: torch.Tensor, spec: SigmoidRouting
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (ids [T, k] int64 by descending biased score, weights [T, k] float32)."""
    scores, choice = sigmoid_scores(logits, bias, spec)
    ids = choice.topk(spec.top_k, dim=-1).indices
    w = scores.gather(1, ids)
    if spec.norm_topk:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, w * spec.scale if spec.scale != 1.0 else w
