"""Torch reference for routed experts: the oracle every expert kernel is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def expert_ffn(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One SiLU-gated expert. x [T, D], gate_up [2I, D], down [D, I] -> [T, D] (weights of another dtype, such as a
    CPU's bf16 banks under float32 steps, are widened to x's first)."""
    gu = F.linear(x, gate_up.to(x.dtype))
    gate, up = gu.chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down.to(x.dtype))


def moe_reference(
    x: torch.Tensor,  # [T, D]
    topk_ids: torch.Tensor,  # [T, k] pool rows (eid) or per-layer ids offset by the caller
    topk_w: torch.Tensor,  # [T, k]
    gate_up: torch.Tensor,  # [N, 2I, D]
    down: torch.Tensor,  # [N, D, I]
) -> torch.Tensor:
    """Loop over the distinct experts (sort by expert); accumulates in float32."""
    T, D = x.shape
    out = torch.zeros((T, D), dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    flat_tok = torch.arange(T, device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_w = topk_w.reshape(-1).to(torch.float32)
    order = torch.argsort(flat_ids, stable=True)
    ids_sorted = flat_ids[order]
    uniq, counts = torch.unique_consecutive(ids_sorted, return_counts=True)
    start = 0
    for e, c in zip(uniq.tolist(), counts.tolist()):
        sel = order[start : start + c]
        start += c
        tok = flat_tok[sel]
        y = expert_ffn(x[tok], gate_up[e], down[e]).to(torch.float32)
        out.index_add_(0, tok, y * flat_w[sel, None])
    return out.to(x.dtype)
