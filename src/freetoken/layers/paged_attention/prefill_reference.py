"""The torch reference of causal varlen prefill attention over the paged KV pool (CPU, tests, and CUDA without
Triton): per sequence, its context gathered once through the page table, then its new tokens in blocks of
query rows, each block attending to the keys its rows can see (SDPA with a [rows, keys] mask). A block's
scores are [H, rows, keys]: rows are chosen so that stays under ``SCORE_ELEMENTS``, so a long prompt never
materialises T x T."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.layers.paged_attention import PrefillMeta

SCORE_ELEMENTS = 1 << 24  # scores of one block of query rows, all heads (64 MiB in float32)
MIN_ROWS = 16


def rows_per_block(heads: int, keys: int) -> int:
    return max(MIN_ROWS, SCORE_ELEMENTS // max(1, heads * keys))


def paged_prefill_reference(
    q: torch.Tensor,  # [T, H, hd]
    k_cache: torch.Tensor,  # [slots, Hkv, hd]
    v_cache: torch.Tensor,
    meta: PrefillMeta,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [T, H, hd], q's dtype
    H, hkv = q.shape[1], k_cache.shape[1]
    out = torch.empty_like(q)
    S = meta.page_size
    table = meta.block_table.long()
    for s, (q0, n, ctx) in enumerate(zip(meta.q_start.tolist(), meta.q_len.tolist(), meta.ctx_len.tolist())):
        pos = torch.arange(ctx, device=q.device)
        slots = table[s, pos // S] * S + pos % S
        ks, vs = k_cache[slots].transpose(0, 1), v_cache[slots].transpose(0, 1)  # [Hkv, ctx, hd]
        step = rows_per_block(H, ctx)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            first, last = ctx - n + r0, ctx - n + r1  # positions of the block's rows: [first, last)
            lo = 0 if window is None else max(0, first - window + 1)
            q_pos = torch.arange(first, last, device=q.device)[:, None]
            k_pos = torch.arange(lo, last, device=q.device)[None, :]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= (q_pos - k_pos) < window
            qs = q[q0 + r0 : q0 + r1].transpose(0, 1)  # [H, rows, hd]
            o = F.scaled_dot_product_attention(
                qs, ks[:, lo:last], vs[:, lo:last], attn_mask=mask, scale=scale, enable_gqa=H != hkv
            )
            out[q0 + r0 : q0 + r1] = o.transpose(0, 1)
    return out
