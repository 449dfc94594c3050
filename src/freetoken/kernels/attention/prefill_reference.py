"""The torch reference of causal varlen prefill attention over the paged KV pool (CPU, tests, and CUDA without
Triton): per sequence, its context gathered once through the page table, then

- on a CPU without a sliding window: torch's flash attention CPU kernel twice, its new tokens over the context
  before them (no mask) and over themselves (causal, a square), merged exactly by their log-sum-exps: no mask
  is built and the kernel skips the causal square's upper blocks;
- otherwise: its new tokens in blocks of query rows, each block attending to the keys its rows can see (SDPA
  with a [rows, keys] mask). A block's scores are [H, rows, keys]: rows are chosen so that stays under
  ``SCORE_ELEMENTS``, so a long prompt never materialises T x T.

SDPA gets 4-d tensors: with 3-d ones torch's CPU dispatch takes the math backend, which materialises the
scores and runs several times slower."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.kernels.attention import PrefillMeta
from freetoken.kernels.attention.sinks import sdpa_with_sinks

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
    sinks: torch.Tensor | None = None,  # [H] float32: a sink logit per head (gpt-oss)
) -> torch.Tensor:  # [T, H, hd], q's dtype
    out = torch.empty_like(q)
    S = meta.page_size
    table = meta.block_table.long()
    for s, (q0, n, ctx) in enumerate(zip(meta.q_start.tolist(), meta.q_len.tolist(), meta.ctx_len.tolist())):
        if n == 0:
            continue
        pos = torch.arange(ctx, device=q.device)
        slots = table[s, pos // S] * S + pos % S
        ks, vs = k_cache[slots].transpose(0, 1), v_cache[slots].transpose(0, 1)  # [Hkv, ctx, hd]
        qs = q[q0 : q0 + n].transpose(0, 1)  # [H, n, hd]
        if window is None and q.device.type == "cpu" and sinks is None:
            o = causal_flash_cpu(qs, ks, vs, scale)
        else:
            o = causal_in_row_blocks(qs, ks, vs, scale, window, sinks)
        out[q0 : q0 + n] = o.transpose(0, 1)
    return out


def causal_flash_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [H, n, hd], the sequence's last n positions; k, v [Hkv, ctx, hd] -> [H, n, hd]. The first ctx - n keys
    are seen by every row, the last n causally."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # returns (out, logsumexp) too
    n, ctx, rep = q.shape[1], k.shape[1], q.shape[0] // k.shape[0]
    q4 = q[None]
    k4, v4 = (t.repeat_interleave(rep, dim=0)[None] if rep > 1 else t[None] for t in (k, v))  # [1, H, ctx, hd]
    before = ctx - n
    own, own_lse = flash(q4, k4[:, :, before:], v4[:, :, before:], 0.0, True, scale=scale)[:2]
    if before == 0:
        return own[0]
    past, past_lse = flash(q4, k4[:, :, :before], v4[:, :, :before], 0.0, False, scale=scale)[:2]
    top = torch.maximum(own_lse, past_lse)
    w_own, w_past = (own_lse - top).exp(), (past_lse - top).exp()  # [1, H, n] float32
    merged = (own.float() * w_own[..., None] + past.float() * w_past[..., None]) / (w_own + w_past)[..., None]
    return merged[0].to(q.dtype)


def causal_in_row_blocks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """As ``causal_flash_cpu``, with an optional sliding window and sinks, on any device: blocks of query rows, each
    with its [rows, keys] mask."""
    H, n, ctx = q.shape[0], q.shape[1], k.shape[1]
    out = torch.empty_like(q)
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
        qb, kb, vb = q[None, :, r0:r1], k[None, :, lo:last], v[None, :, lo:last]
        if sinks is not None:
            out[:, r0:r1] = sdpa_with_sinks(qb, kb, vb, mask, scale, sinks)[0].to(out.dtype)
            continue
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=H != k.shape[0])
        out[:, r0:r1] = o[0]
    return out
