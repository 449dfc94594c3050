"""Paged decode attention in Triton, split-KV (flash-decoding): program (b, kv head, split) reads its
share of sequence b's context through the page table, in place, for the G query heads of that KV
head at once (GQA), with an online softmax; a second launch merges the splits exactly (``merge_splits``
is its torch reference). The grid
is fixed for a batch size, whatever the lengths (each split takes 1/SPLITS of its sequence's context),
so a CUDA graph captures it once."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.layers.paged_attention import DecodeMeta

BLOCK_N = 32  # context tokens per inner iteration


@triton.jit
def _paged_decode_kernel(
    Q, K, V, BT, LENS, ACC, MAX, SUM,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_bt,
    stride_ab, stride_ah, stride_as,
    scale, window,
    PAGE: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, HD: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(LENS + b)
    start = 0
    if HAS_WINDOW:
        start = tl.maximum(length - window, 0)
    chunk = tl.cdiv(tl.cdiv(length - start, SPLITS), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(lo + chunk, length)
    g = tl.arange(0, BLOCK_G)
    heads = kvh * G + g
    gmask = g < G
    d = tl.arange(0, HD)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HD], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)
        tmask = t < hi
        page = tl.load(BT + b * stride_bt + t // PAGE, mask=tmask, other=0)
        slot = page.to(tl.int64) * PAGE + t % PAGE
        k = tl.load(K + slot[:, None] * stride_kt + kvh * stride_kh + d[None, :], mask=tmask[:, None], other=0.0)
        v = tl.load(V + slot[:, None] * stride_vt + kvh * stride_vh + d[None, :], mask=tmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale  # [BLOCK_G, BLOCK_N] float32
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m = m_new
    out = b * stride_ab + heads * stride_ah + split * stride_as
    tl.store(ACC + out[:, None] * HD + d[None, :], acc, mask=gmask[:, None])
    tl.store(MAX + out, m, mask=gmask)
    tl.store(SUM + out, l_sum, mask=gmask)


def default_splits(batch: int, kv_heads: int) -> int:
    """Enough programs to fill a large GPU at batch 1, few where the batch already does."""
    return max(1, min(32, 256 // max(1, batch * kv_heads)))


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: DecodeMeta,
    scale: float,
    window: int | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    B, H, hd = q.shape
    hkv = k_cache.shape[1]
    if H % hkv or hd & (hd - 1) or hd < 16:
        raise ValueError(f"paged decode: {H} query heads over {hkv} KV heads, head dim {hd} (a power of 2 >= 16)")
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError("paged decode: the head dim must be contiguous")
    g = H // hkv
    s = splits or default_splits(B, hkv)
    acc = torch.empty((B, H, s, hd), dtype=torch.float32, device=q.device)
    mx = torch.empty((B, H, s), dtype=torch.float32, device=q.device)
    sm = torch.empty((B, H, s), dtype=torch.float32, device=q.device)
    bt = meta.block_table
    _paged_decode_kernel[(B, hkv, s)](
        q, k_cache, v_cache, bt, meta.seq_lens, acc, mx, sm,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        bt.stride(0), H * s, s, 1,
        scale, window or 0,
        PAGE=meta.page_size, G=g, BLOCK_G=max(16, triton.next_power_of_2(g)), HD=hd,
        BLOCK_N=BLOCK_N, SPLITS=s, HAS_WINDOW=window is not None,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",  # float32 exact (TF32 would round it)
    )  # fmt: skip
    out = torch.empty((B, H, hd), dtype=q.dtype, device=q.device)
    _merge_kernel[(B * H,)](acc, mx, sm, out, S=s, BLOCK_S=max(2, triton.next_power_of_2(s)), HD=hd)
    return out


@triton.jit
def _merge_kernel(ACC, MAX, SUM, OUT, S: tl.constexpr, BLOCK_S: tl.constexpr, HD: tl.constexpr):
    """Program (b, h): the splits' partial sums weighted by exp(max - top), over the weighted sums."""
    bh = tl.program_id(0).to(tl.int64)
    sp = tl.arange(0, BLOCK_S)
    smask = sp < S
    d = tl.arange(0, HD)
    mx = tl.load(MAX + bh * S + sp, mask=smask, other=float("-inf"))
    w = tl.exp(mx - tl.max(mx, 0))  # an empty split: exp(-inf) = 0
    w = tl.where(smask, w, 0.0)
    sm = tl.load(SUM + bh * S + sp, mask=smask, other=0.0)
    acc = tl.load(ACC + (bh * S + sp)[:, None] * HD + d[None, :], mask=smask[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], 0) / tl.sum(sm * w, 0)
    tl.store(OUT + bh * HD + d, o.to(OUT.dtype.element_ty))


def merge_splits(acc: torch.Tensor, mx: torch.Tensor, sm: torch.Tensor) -> torch.Tensor:
    """Exact softmax merge of the splits' partial sums: acc [B, H, S, hd], max / sum [B, H, S]."""
    top = mx.max(dim=-1, keepdim=True).values
    w = torch.exp(mx - top)  # an empty split: exp(-inf) = 0
    return (acc * w[..., None]).sum(dim=2) / (sm * w).sum(dim=-1, keepdim=True)
