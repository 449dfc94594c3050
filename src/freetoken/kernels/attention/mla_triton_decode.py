"""MLA decode in Triton over paged latents, absorbed (``mla_reference.py`` is its reference), split-KV: program
(b, head block, split) reads its share of sequence b's latents through the page table, in place, once for
``BLOCK_H`` query heads (every head attends over the same latents: MQA of head dim R + dr whose values are the
latents' first R columns), with an online softmax, and writes partial sums; ``merge_splits`` (torch) merges the
splits exactly. The grid is fixed for a batch size, whatever the lengths, so a CUDA graph captures it once.
Shapes: B sequences, H heads, R = kv_lora_rank, dr = qk_rope_head_dim (each padded to a power of two, masked).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.triton_decode import merge_splits

BLOCK_N = 32  # context tokens per inner iteration (16 for float32 latents of 512)
BLOCK_H = 16  # query heads per program (tl.dot's smallest tile)


@triton.jit
def _mla_decode_kernel(
    Q, C, BT, LENS, ACC, MAX, SUM,
    stride_qb, stride_qh, stride_ct, stride_bt, stride_ab, stride_ah, stride_as,
    scale,
    H: tl.constexpr, R: tl.constexpr, DR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_DR: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(LENS + b)
    chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, length)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    r = tl.arange(0, BLOCK_R)
    rr = tl.arange(0, BLOCK_DR)
    rmask, rrmask = r < R, rr < DR
    qrow = Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    q_lat = tl.load(qrow + r[None, :], mask=hmask[:, None] & rmask[None, :], other=0.0)
    q_rope = tl.load(qrow + R + rr[None, :], mask=hmask[:, None] & rrmask[None, :], other=0.0)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)
        tmask = t < hi
        page = tl.load(BT + b * stride_bt + t // PAGE, mask=tmask, other=0)
        row = C + (page.to(tl.int64) * PAGE + t % PAGE)[:, None] * stride_ct
        c = tl.load(row + r[None, :], mask=tmask[:, None] & rmask[None, :], other=0.0)  # [BLOCK_N, BLOCK_R]
        kr = tl.load(row + R + rr[None, :], mask=tmask[:, None] & rrmask[None, :], other=0.0)
        s = tl.dot(q_lat, tl.trans(c), input_precision=PREC)
        s = (s + tl.dot(q_rope, tl.trans(kr), input_precision=PREC)) * scale  # [BLOCK_H, BLOCK_N] float32
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=PREC)
        m = m_new
    part = b * stride_ab + heads * stride_ah + split * stride_as
    tl.store(ACC + part[:, None] * BLOCK_R + r[None, :], acc, mask=hmask[:, None])
    tl.store(MAX + part, m, mask=hmask)
    tl.store(SUM + part, l_sum, mask=hmask)


def default_splits(batch: int, heads: int) -> int:
    """Enough programs to fill a large GPU at batch 1, few where the batch already does."""
    return max(1, min(32, 256 // max(1, batch * triton.cdiv(heads, BLOCK_H))))


def mla_decode_triton(
    q: torch.Tensor,  # [B, H, R + dr]
    cache: torch.Tensor,  # [slots, 1, R + dr]
    meta: DecodeMeta,
    scale: float,
    rank: int,
    splits: int | None = None,
) -> torch.Tensor:  # [B, H, R] in q's dtype
    B, H, width = q.shape
    if cache.shape[1] != 1 or cache.shape[2] != width or width <= rank:
        raise ValueError(f"MLA decode: a query of {width} over latent rows {tuple(cache.shape[1:])}, rank {rank}")
    if q.stride(2) != 1 or cache.stride(2) != 1:
        raise ValueError("MLA decode: the latent dim must be contiguous")
    dr = width - rank
    block_r = max(16, triton.next_power_of_2(rank))
    s = splits or default_splits(B, H)
    wide = block_r >= 256
    block_n = BLOCK_N // 2 if block_r * cache.element_size() > 1024 else BLOCK_N  # a latent tile within shared memory
    acc = torch.empty((B, H, s, block_r), dtype=torch.float32, device=q.device)
    mx = torch.empty((B, H, s), dtype=torch.float32, device=q.device)
    sm = torch.empty((B, H, s), dtype=torch.float32, device=q.device)
    bt = meta.block_table
    _mla_decode_kernel[(B, triton.cdiv(H, BLOCK_H), s)](
        q, cache, bt, meta.seq_lens, acc, mx, sm,
        q.stride(0), q.stride(1), cache.stride(0), bt.stride(0), H * s, s, 1,
        scale,
        H=H, R=rank, DR=dr, BLOCK_R=block_r, BLOCK_DR=max(16, triton.next_power_of_2(dr)),
        PAGE=meta.page_size, BLOCK_H=BLOCK_H, BLOCK_N=block_n, SPLITS=s,
        PREC="ieee" if cache.dtype == torch.float32 else "tf32",  # float32 exact (TF32 would round it)
        num_warps=8 if wide else 4, num_stages=2 if wide else 3,  # DeepSeek's R = 512: a [16, 512] accumulator
    )  # fmt: skip
    return merge_splits(acc[..., :rank], mx, sm).to(q.dtype)
