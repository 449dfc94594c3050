"""Paged decode attention in Triton, split-KV (flash-decoding), in one launch: program (b, kv head, split) reads
its share of sequence b's context through the page table, in place, for the G query heads of that KV head at once
(GQA), with an online softmax, and writes its partial sums; the last of a (b, kv head)'s programs to finish (a
ticket counter, ``triton_support.tickets``, that it resets for the next launch) merges the splits exactly
(``merge_splits`` is the merge's torch reference) and writes the output. One split writes the output directly.
The grid is fixed for a batch size, whatever the lengths (each split takes 1/SPLITS of its sequence's context), so
a CUDA graph captures it once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.qkv_rope_triton import norm_rope
from freetoken.kernels.triton_support import tickets

BLOCK_N = 32  # context tokens per inner iteration


@triton.jit
def _paged_decode_kernel(
    Q, K, V, BT, LENS, ACC, MAX, SUM, OUT, CNT,
    POS, SLOT, COS, SIN, QW, KW, SINKS,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_bt,
    stride_ab, stride_ah, stride_as, stride_ob, stride_oh,
    scale, window, eps,
    PAGE: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, HD: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr,
    PREC: tl.constexpr,
    ROPE: tl.constexpr, H: tl.constexpr, ROT: tl.constexpr, HAS_QN: tl.constexpr, HAS_KN: tl.constexpr,
    HAS_SINKS: tl.constexpr,
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
    last = length - 1  # the new token
    if ROPE:  # Q = the fused projection's rows (q | k | v): this step's q/k norms, rotary and K/V row made here
        half: tl.constexpr = ROT // 2
        partner = tl.where(d < half, d + half, tl.where(d < ROT, d - half, d))
        sign = tl.where(d < half, -1.0, 1.0)
        pos = tl.load(POS + b).to(tl.int64)
        dt = Q.dtype.element_ty
        cos = tl.load(COS + pos * ROT + d, mask=d < ROT, other=1.0).to(dt).to(tl.float32)
        sin = tl.load(SIN + pos * ROT + d, mask=d < ROT, other=0.0).to(dt).to(tl.float32)
        row = Q + b.to(tl.int64) * stride_qb
        qx = tl.load(row + heads[:, None] * HD + d[None, :], mask=gmask[:, None], other=0.0)
        qp = tl.load(row + heads[:, None] * HD + partner[None, :], mask=gmask[:, None], other=0.0)
        q = norm_rope(qx, qp, QW, QW + partner, cos, sin, sign, d, eps, HD, ROT, HAS_QN).to(K.dtype.element_ty)
        kx = tl.load(row + (H + kvh) * HD + d)
        kp = tl.load(row + (H + kvh) * HD + partner)
        k_new = norm_rope(kx, kp, KW, KW + partner, cos, sin, sign, d, eps, HD, ROT, HAS_KN).to(K.dtype.element_ty)
        v_new = tl.load(row + (H + tl.num_programs(1) + kvh) * HD + d).to(V.dtype.element_ty)
        slot_new = tl.load(SLOT + b).to(tl.int64)
        own = (lo <= last) & (last < hi)  # the split that reads the new token writes it (for the later steps)
        tl.store(K + slot_new * stride_kt + kvh * stride_kh + d, k_new, mask=own & (d < HD))
        tl.store(V + slot_new * stride_vt + kvh * stride_vh + d, v_new, mask=own & (d < HD))
    else:
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
        if ROPE:  # the new token's row from registers (its store above may not be visible to this load)
            k = tl.where((t == last)[:, None], k_new[None, :], k)
            v = tl.where((t == last)[:, None], v_new[None, :], v)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale  # [BLOCK_G, BLOCK_N] float32
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m = m_new
    optr = OUT + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
    if SPLITS == 1:
        if HAS_SINKS:  # the sink logit joins the denominator (it carries no value)
            l_sum += tl.exp(tl.load(SINKS + heads, mask=gmask, other=0.0) - m)
        l_sum = tl.where(gmask, l_sum, 1.0)  # padding heads: no 0 / 0
        tl.store(optr, (acc / l_sum[:, None]).to(OUT.dtype.element_ty), mask=gmask[:, None])
    else:
        part = b * stride_ab + heads * stride_ah  # split 0 of each head
        tl.store(ACC + (part + split * stride_as)[:, None] * HD + d[None, :], acc, mask=gmask[:, None])
        tl.store(MAX + part + split * stride_as, m, mask=gmask)
        tl.store(SUM + part + split * stride_as, l_sum, mask=gmask)
        tl.debug_barrier()  # every thread's partial stored before the ticket releases them
        cnt = CNT + b * tl.num_programs(1) + kvh
        ticket = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLITS - 1:  # the last split of (b, kv head): the others' partials are visible
            strides = (stride_ab, stride_ah, stride_as, stride_ob, stride_oh)
            _merge(ACC, MAX, SUM, OUT, SINKS, b, kvh, *strides, G, SPLITS, BLOCK_S, HD, HAS_SINKS)
            tl.store(cnt, 0)  # ready for the next launch


@triton.jit
def _merge(ACC, MAX, SUM, OUT, SINKS, b, kvh, stride_ab, stride_ah, stride_as, stride_ob, stride_oh,
           G: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HD: tl.constexpr,
           HAS_SINKS: tl.constexpr):  # fmt: skip
    """Per head of this KV head: the splits' partial sums weighted by exp(max - top), over the weighted sums (read
    from L2: other programs wrote them), plus exp(sink - top) with sinks."""
    sp = tl.arange(0, BLOCK_S)
    smask = sp < SPLITS
    d = tl.arange(0, HD)
    for gi in tl.static_range(G):
        row = b * stride_ab + (kvh * G + gi) * stride_ah + sp * stride_as
        mx = tl.load(MAX + row, mask=smask, other=float("-inf"), cache_modifier=".cg")
        w = tl.where(smask, tl.exp(mx - tl.max(mx, 0)), 0.0)  # an empty split: exp(-inf) = 0
        sm = tl.load(SUM + row, mask=smask, other=0.0, cache_modifier=".cg")
        acc = tl.load(ACC + row[:, None] * HD + d[None, :], mask=smask[:, None], other=0.0, cache_modifier=".cg")
        den = tl.sum(sm * w, 0)
        if HAS_SINKS:
            den += tl.exp(tl.load(SINKS + kvh * G + gi) - tl.max(mx, 0))
        o = tl.sum(acc * w[:, None], 0) / den
        tl.store(OUT + b * stride_ob + (kvh * G + gi) * stride_oh + d, o.to(OUT.dtype.element_ty))


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
    sinks: torch.Tensor | None = None,  # [H] float32 sink logits (gpt-oss)
) -> torch.Tensor:
    B, H, hd = q.shape
    if q.stride(2) != 1:
        raise ValueError("paged decode: the head dim must be contiguous")
    return _launch(q, (q.stride(0), q.stride(1)), H, hd, k_cache, v_cache, meta, scale, window, splits, None, sinks)


def paged_decode_rope_triton(
    qkv: torch.Tensor,  # [B, (H + 2*Hkv) * hd] the fused projection (q | k | v) of one new token per sequence
    positions: torch.Tensor,  # [B] int64
    slot_mapping: torch.Tensor,  # [B] int64 the new K/V rows' flat slots
    cos: torch.Tensor,  # [P, rot] float32 (rotary's tables)
    sin: torch.Tensor,
    q_norm: torch.Tensor | None,  # [hd] per-head weights
    k_norm: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: DecodeMeta,
    num_heads: int,
    head_dim: int,
    scale: float,
    window: int | None = None,
    splits: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # [B, H, hd] in qkv's dtype
    """``qkv_rope_triton`` (q/k norms, rotary, the K/V rows written) and ``paged_decode_triton`` in one launch: each
    program makes its q heads and its KV head's new row from ``qkv`` with the same arithmetic."""
    hkv, hd = k_cache.shape[1], head_dim
    rot = int(cos.shape[1])
    if qkv.shape[1] != (num_heads + 2 * hkv) * hd or qkv.stride(1) != 1:
        raise ValueError(f"paged decode: rows of {qkv.shape[1]} for {num_heads}+2x{hkv} heads of {hd}")
    if rot % 2 or rot > hd:
        raise ValueError(f"paged decode: rotary dim {rot} for head dim {hd}")
    qw = q_norm.to(qkv.dtype).contiguous() if q_norm is not None else qkv
    kw = k_norm.to(qkv.dtype).contiguous() if k_norm is not None else qkv
    rope = (positions, slot_mapping, cos, sin, qw, kw, eps, rot, q_norm is not None, k_norm is not None)
    return _launch(qkv, (qkv.stride(0), hd), num_heads, hd, k_cache, v_cache, meta, scale, window, splits, rope, sinks)


def _launch(
    q: torch.Tensor, q_strides: tuple[int, int], H: int, hd: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: DecodeMeta, scale: float, window: int | None, splits: int | None, rope: tuple | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    B, hkv = q.shape[0], k_cache.shape[1]
    if H % hkv or hd & (hd - 1) or hd < 16:
        raise ValueError(f"paged decode: {H} query heads over {hkv} KV heads, head dim {hd} (a power of 2 >= 16)")
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1:
        raise ValueError("paged decode: the head dim must be contiguous")
    g = H // hkv
    s = splits or default_splits(B, hkv)
    out = torch.empty((B, H, hd), dtype=q.dtype, device=q.device)
    acc = torch.empty((B, H, s, hd), dtype=torch.float32, device=q.device)
    mx = torch.empty((B, H, s), dtype=torch.float32, device=q.device)
    sm = torch.empty((B, H, s), dtype=torch.float32, device=q.device)
    pos, slots, cos, sin, qw, kw, eps, rot, qn, kn = rope or (q, q, q, q, q, q, 0.0, 2, False, False)
    bt = meta.block_table
    sk = q if sinks is None else sinks.to(device=q.device, dtype=torch.float32).contiguous()
    _paged_decode_kernel[(B, hkv, s)](
        q, k_cache, v_cache, bt, meta.seq_lens, acc, mx, sm, out, tickets(q.device, B * hkv, "paged_decode"),
        pos, slots, cos, sin, qw, kw, sk,
        *q_strides, k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        bt.stride(0), H * s, s, 1, out.stride(0), out.stride(1),
        scale, window or 0, eps,
        PAGE=meta.page_size, G=g, BLOCK_G=max(16, triton.next_power_of_2(g)), HD=hd,
        BLOCK_N=BLOCK_N, SPLITS=s, BLOCK_S=max(2, triton.next_power_of_2(s)), HAS_WINDOW=window is not None,
        PREC="ieee" if k_cache.dtype == torch.float32 else "tf32",  # float32 exact (TF32 would round it)
        ROPE=rope is not None, H=H, ROT=rot, HAS_QN=qn, HAS_KN=kn, HAS_SINKS=sinks is not None,
    )  # fmt: skip
    return out


def merge_splits(
    acc: torch.Tensor, mx: torch.Tensor, sm: torch.Tensor, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """Exact softmax merge of the splits' partial sums: acc [B, H, S, hd], max / sum [B, H, S] (sinks [H]: each
    head's sink logit joins the denominator)."""
    top = mx.max(dim=-1, keepdim=True).values
    w = torch.exp(mx - top)  # an empty split: exp(-inf) = 0
    den = (sm * w).sum(dim=-1, keepdim=True)
    if sinks is not None:
        den = den + torch.exp(sinks.float()[None, :, None] - top)
    return (acc * w[..., None]).sum(dim=2) / den
