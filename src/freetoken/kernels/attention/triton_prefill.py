"""Causal varlen prefill attention over the paged KV pool in Triton (flash-attention style): program
(sequence, query block, head) reads its sequence's context through the page table in place, with an
online softmax; never a T x T matrix in memory. The new tokens' K/V are in the pages already."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.attention import PrefillMeta

BLOCK_M = 32  # query rows per program
BLOCK_N = 32  # context tokens per inner iteration


@triton.jit
def _paged_prefill_kernel(
    Q, K, V, O, BT, QSTART, QLEN, CTX, SINKS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_bt,
    scale, window,
    PAGE: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, PREC: tl.constexpr, HAS_SINKS: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    mblock = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // G
    q_len = tl.load(QLEN + s)
    if mblock * BLOCK_M >= q_len:
        return
    q_start = tl.load(QSTART + s)
    ctx = tl.load(CTX + s)
    rows = mblock * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this sequence
    rmask = rows < q_len
    pos = ctx - q_len + rows  # their positions
    d = tl.arange(0, HD)
    q = tl.load(Q + (q_start + rows)[:, None] * stride_qt + h * stride_qh + d[None, :], mask=rmask[:, None], other=0.0)
    last = tl.minimum(ctx - q_len + mblock * BLOCK_M + BLOCK_M, ctx)  # one past the last position any row sees
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx - q_len + mblock * BLOCK_M - window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HD], tl.float32)
    for n0 in range(lo, last, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)
        tmask = t < last
        page = tl.load(BT + s * stride_bt + t // PAGE, mask=tmask, other=0)
        slot = page.to(tl.int64) * PAGE + t % PAGE
        k = tl.load(K + slot[:, None] * stride_kt + kvh * stride_kh + d[None, :], mask=tmask[:, None], other=0.0)
        v = tl.load(V + slot[:, None] * stride_vt + kvh * stride_vh + d[None, :], mask=tmask[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        visible = tmask[None, :] & (t[None, :] <= pos[:, None])
        if HAS_WINDOW:
            visible &= t[None, :] > pos[:, None] - window
        sc = tl.where(visible, sc, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        alpha = tl.exp(m - m_safe)
        p = tl.exp(sc - m_safe[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m = m_new
    if HAS_SINKS:  # the head's sink logit joins the denominator (every stored row saw its own token: m finite)
        l_sum += tl.exp(tl.load(SINKS + h) - tl.where(m == float("-inf"), 0.0, m))
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]  # rows past the sequence: never stored
    tl.store(O + (q_start + rows)[:, None] * stride_ot + h * stride_oh + d[None, :], out.to(O.dtype.element_ty),
             mask=rmask[:, None])  # fmt: skip


def paged_prefill_triton(
    q: torch.Tensor,  # [T, H, hd]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PrefillMeta,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,  # [H] float32 sink logits (gpt-oss)
) -> torch.Tensor:
    T, H, hd = q.shape
    hkv = k_cache.shape[1]
    if H % hkv or hd & (hd - 1) or hd < 16:
        raise ValueError(f"paged prefill: {H} query heads over {hkv} KV heads, head dim {hd} (a power of 2 >= 16)")
    q = q.contiguous()
    out = torch.empty_like(q)
    S = meta.q_start.shape[0]
    bt = meta.block_table
    grid = (S, triton.cdiv(meta.max_q_len, BLOCK_M), H)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, out, bt, meta.q_start, meta.q_len, meta.ctx_len,
        q if sinks is None else sinks.to(device=q.device, dtype=torch.float32).contiguous(),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1), bt.stride(0),
        scale, window or 0,
        PAGE=meta.page_size, G=H // hkv, HD=hd, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        HAS_WINDOW=window is not None, PREC="ieee" if q.dtype == torch.float32 else "tf32",
        HAS_SINKS=sinks is not None,
    )  # fmt: skip
    return out
