"""The router's softmax, top-k and renormalisation in one Triton launch per MoE layer (CUDA).

In torch the same is ~6 kernels per layer (softmax, topk, sum, divide, two casts). Program = one token's
row of E router logits: float32 softmax, k rounds of "largest, lowest index on ties", the weights divided
by their sum when the model renormalises, then rounded to the activation dtype (as the reference casts
the routing weights before use) and returned in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _route_kernel(
    L, IDS, W, E, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr,
    ACT: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    emask = e < E
    logit = tl.load(L + t * E + e, mask=emask, other=float("-inf")).to(tl.float32)
    p = tl.exp(logit - tl.max(logit, 0))
    p = tl.where(emask, p, 0.0)
    p = p / tl.sum(p, 0)
    p = tl.where(emask, p, -1.0)
    kk = tl.arange(0, BLOCK_K)
    ids = tl.zeros((BLOCK_K,), tl.int64)
    ws = tl.zeros((BLOCK_K,), tl.float32)
    for j in tl.static_range(K):
        top = tl.max(p, 0)
        idx = tl.min(tl.where(p == top, e, BLOCK_E), 0)
        ids = tl.where(kk == j, idx.to(tl.int64), ids)
        ws = tl.where(kk == j, top, ws)
        p = tl.where(e == idx, -1.0, p)
    if NORM:
        ws = ws / tl.sum(tl.where(kk < K, ws, 0.0), 0)
    ws = ws.to(ACT).to(tl.float32)
    kmask = kk < K
    tl.store(IDS + t * K + kk, ids, mask=kmask)
    tl.store(W + t * K + kk, ws, mask=kmask)


def route_triton(
    logits: torch.Tensor, top_k: int, norm_topk: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (ids [T, k] int64, weights [T, k] float32 holding ``dtype``-rounded values)."""
    T, E = logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"route: top-{top_k} of {E} experts")
    logits = logits.contiguous()
    ids = torch.empty((T, top_k), dtype=torch.int64, device=logits.device)
    w = torch.empty((T, top_k), dtype=torch.float32, device=logits.device)
    if T:
        _route_kernel[(T,)](
            logits, ids, w, E, K=top_k, BLOCK_E=triton.next_power_of_2(E),
            BLOCK_K=max(2, triton.next_power_of_2(top_k)), NORM=norm_topk, ACT=_TL[dtype],
        )  # fmt: skip
    return ids, w
