"""Attention sinks (gpt-oss), the torch reference: a learned logit per query head joins every softmax's denominator
and carries no value, ``softmax([scores, sink])[:-1] @ V``. The references compute it explicitly (SDPA has no sink
term); the Triton kernels add ``exp(sink - max)`` to their running sum at the end (``triton_decode.py``,
``triton_prefill.py``)."""

from __future__ import annotations

import torch


def sdpa_with_sinks(
    q: torch.Tensor,  # [B, H, n, hd]
    k: torch.Tensor,  # [B, Hkv, N, hd]
    v: torch.Tensor,  # [B, Hkv, N, hd]
    mask: torch.Tensor,  # bool, broadcastable to [B, H, n, N]: True where a key is visible
    scale: float,
    sinks: torch.Tensor,  # [H] float32
) -> torch.Tensor:  # [B, H, n, hd] in float32
    """Masked attention with one sink logit per head, in float32 (GQA: KV heads repeated)."""
    H, hkv = q.shape[1], k.shape[1]
    if H != hkv:
        k, v = k.repeat_interleave(H // hkv, dim=1), v.repeat_interleave(H // hkv, dim=1)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [B, H, n, N]
    s = s.masked_fill(~mask, float("-inf"))
    sink = sinks.float().view(1, H, 1, 1).expand(s.shape[0], H, s.shape[2], 1)
    p = torch.softmax(torch.cat((s, sink), dim=-1), dim=-1)[..., :-1]
    return torch.matmul(p, v.float())
