"""The torch reference of DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5) over paged latents. Each cache row
holds the MLA latent ``[c (R), kr (dr)]`` (``mla_reference.py``) followed by the lightning indexer's key ``ik`` [Di].

- The indexer scores every context position t for a query: ``sum_h w[h] * relu(iq[h] . ik[t])`` (the head weights
  ``w`` carry the ``Hi^-0.5 * Di^-0.5`` scales: ``layers/dsa.py``), in float32 (``index_scores``).
- Each query keeps the ``min(topk, visible)`` best of the positions it may see (causal: its own and earlier ones;
  ``select``): with a context no longer than ``index_topk`` it attends everything, as dense MLA does.
- decode (``dsa_decode_reference``): the absorbed MQA of ``mla_decode_reference`` over the kept latents only.
- prefill (``dsa_prefill_reference``): absorbed too - each new token gathers its kept latents (at most topk
  whatever the context) and attends them as decode does; a block of tokens at a time, memory bounded.
Shapes: B sequences, T new tokens, H heads, Hi indexer heads, Di indexer head dim, L = R + dr (latent width).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.kernels.attention.decode_reference import context_slots

ELEMENTS = 1 << 26  # float32 values a prefill block of queries may hold (scores over the context, kept latents)


def index_scores(iq: torch.Tensor, iw: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """iq [..., n, Hi, Di], iw [..., n, Hi], keys [..., m, Di] -> the indexer's scores [..., n, m] float32."""
    dots = torch.matmul(iq.float(), keys.float().transpose(-1, -2).unsqueeze(-3))  # [..., n, Hi, m]
    return torch.matmul(iw.float().unsqueeze(-2), F.relu(dots)).squeeze(-2)


def select(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """The kept positions [..., n, m] bool: each row's ``topk`` best visible scores (all visible ones when fewer)."""
    masked = scores.masked_fill(~visible, float("-inf"))
    k = min(topk, masked.shape[-1])
    idx = masked.topk(k, dim=-1).indices
    return torch.zeros_like(visible).scatter_(-1, idx, True) & visible


def _decode_context(meta: DecodeMeta) -> tuple[torch.Tensor, torch.Tensor]:
    if meta.block_table.is_cuda:  # a graph's metadata is rewritten in place: nothing may be kept from it
        return context_slots(meta, None)
    return meta.gathered.get(None) or meta.gathered.setdefault(None, context_slots(meta, None))


def selected_slots(
    cache: torch.Tensor, meta: DecodeMeta, width: int, iq: torch.Tensor, iw: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's kept positions as cache slots [B, K] int64, best first (K = min(topk, addressable
    positions); entries past a sequence's count are not slots), and the counts [B] int32 (min(topk, length)): a
    page table of page size 1 over the kept latents (``dsa_triton_decode.py``). No host sync."""
    slots, valid = _decode_context(meta)
    scores = index_scores(iq[:, None], iw[:, None], cache[slots, 0, width:])[:, 0]  # [B, n]
    k = min(topk, scores.shape[-1])
    idx = scores.masked_fill(~valid, float("-inf")).topk(k, dim=-1).indices  # visible positions first
    return slots.gather(1, idx), meta.seq_lens.clamp(max=k).to(torch.int32)


def dsa_decode_reference(
    q: torch.Tensor,  # [B, H, L] the absorbed query
    cache: torch.Tensor,  # [slots, 1, L + Di]
    meta: DecodeMeta,
    scale: float,
    rank: int,  # R
    iq: torch.Tensor,  # [B, Hi, Di]
    iw: torch.Tensor,  # [B, Hi]
    topk: int,
) -> torch.Tensor:  # [B, H, R], q's dtype
    L = q.shape[-1]
    slots, valid = _decode_context(meta)
    rows = cache[slots, 0]  # [B, n, L + Di]
    keep = select(index_scores(iq[:, None], iw[:, None], rows[..., L:])[:, 0], valid, topk)  # [B, n]
    kv = rows[..., :L].float()[:, None]  # [B, 1, n, L]
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None, :], kv, kv[..., :rank], attn_mask=keep[:, None, None, :], scale=scale, enable_gqa=True
    )  # [B, H, 1, R]
    return out[:, :, 0, :].to(q.dtype)


def dsa_prefill_reference(
    q: torch.Tensor,  # [T, H, L] the absorbed queries
    cache: torch.Tensor,  # [slots, 1, L + Di]
    meta: PrefillMeta,
    scale: float,
    rank: int,  # R
    iq: torch.Tensor,  # [T, Hi, Di]
    iw: torch.Tensor,  # [T, Hi]
    topk: int,
) -> torch.Tensor:  # [T, H, R], q's dtype
    """Per sequence, a block of its new tokens at a time: the block's indexer scores over the context, each query's
    kept positions (``select``'s rule, as indices), their latents gathered [rows, K, L] and attended absorbed. Memory
    is bounded by ``ELEMENTS`` per block however long the context; work grows with K = min(topk, context), not with
    the context."""
    T, H, L = q.shape
    out = q.new_empty((T, H, rank))
    S, table = meta.page_size, meta.block_table.long()
    for s, (q0, n, ctx) in enumerate(zip(meta.q_start.tolist(), meta.q_len.tolist(), meta.ctx_len.tolist())):
        if n == 0:
            continue
        pos = torch.arange(ctx, device=q.device)
        slots = table[s, pos // S] * S + pos % S
        keys = cache[slots, 0, L:]  # [ctx, Di]
        k = min(topk, ctx)
        step = max(1, ELEMENTS // (ctx * iq.shape[1] + k * (L + H)))
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            rows = slice(q0 + r0, q0 + r1)
            visible = pos[None, :] <= pos[ctx - n + r0 : ctx - n + r1, None]  # [rows, ctx] causal
            scores = index_scores(iq[rows], iw[rows], keys).masked_fill(~visible, float("-inf"))
            idx = scores.topk(k, dim=-1).indices  # [rows, K]
            lat = cache[slots[idx], 0, :L].float()  # [rows, K, L]
            sc = torch.einsum("nhl,nkl->nhk", q[rows].float(), lat) * scale
            p = torch.softmax(sc.masked_fill(~visible.gather(1, idx)[:, None, :], float("-inf")), dim=-1)
            out[rows] = torch.einsum("nhk,nkr->nhr", p, lat[..., :rank]).to(q.dtype)
    return out
