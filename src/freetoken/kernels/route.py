"""The router's one dispatch point: hidden rows -> (top-k expert ids, their weights). On CUDA the router's GEMM,
softmax and top-k in one Triton launch at decode sizes (after ``F.linear`` at others; ``router_triton.py``); on a CPU
in float32 the softmax + top-k in one C++ call (``cpu_step.route``); ``route_reference`` elsewhere and as their
reference. T = tokens, E = experts, k = experts per token.
"""

from __future__ import annotations

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
