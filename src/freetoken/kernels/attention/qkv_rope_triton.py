"""After the fused QKV projection, in one Triton launch (CUDA): the per-head q/k RMSNorms, rotary on q and k, and
the new K/V rows written into the paged KV pool at the step's slots; returns q.

In torch this is ~22 small kernels per layer (two norms, the cos/sin lookups and casts, rotate-half's
negation and concatenation, three elementwise ops per rotation, two ``index_copy_``), and a decode step pays
each of them per layer. Same arithmetic as the torch path (``Attention._qkv_torch``): float32 norm statistics
with the normalised row rounded to the compute dtype before the weight, cos/sin rounded to the compute dtype,
and each of rotary's products and its sum rounded to the compute dtype, as torch's elementwise ops do.
Program (token t, head j): j < H a query head, else KV head j - H (its K rotated, its V copied).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def norm_rope(x, xp, W, Wp, cos, sin, sign, d, eps, HD: tl.constexpr, ROT: tl.constexpr, HAS_NORM: tl.constexpr):
    """x: one head's row (or [heads, HD] rows), xp: its rotate-half partners (same head); returns the rotated rows in
    x's dtype."""
    if HAS_NORM:
        xf = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=-1, keep_dims=True) / HD + eps)
        w = tl.load(W + d).to(tl.float32)
        wp = tl.load(Wp).to(tl.float32)
        x = (w * (xf * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
        xp = (wp * (xp.to(tl.float32) * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
    a = (x.to(tl.float32) * cos).to(x.dtype)
    b = (sign * xp.to(tl.float32) * sin).to(x.dtype)
    rotated = (a.to(tl.float32) + b.to(tl.float32)).to(x.dtype)
    return tl.where(d < ROT, rotated, x)


@triton.jit
def _qkv_rope_kernel(
    QKV, POS, SLOT, COS, SIN, QW, KW, QOUT, KC, VC,
    stride_t, stride_kc, stride_vc, eps,
    H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, ROT: tl.constexpr,
    HAS_QN: tl.constexpr, HAS_KN: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    d = tl.arange(0, HD)
    half: tl.constexpr = ROT // 2
    partner = tl.where(d < half, d + half, tl.where(d < ROT, d - half, d))
    sign = tl.where(d < half, -1.0, 1.0)
    pos = tl.load(POS + t).to(tl.int64)
    rmask = d < ROT
    dtype = QOUT.dtype.element_ty
    cos = tl.load(COS + pos * ROT + d, mask=rmask, other=1.0).to(dtype).to(tl.float32)
    sin = tl.load(SIN + pos * ROT + d, mask=rmask, other=0.0).to(dtype).to(tl.float32)
    row = QKV + t * stride_t + j * HD
    x = tl.load(row + d)
    xp = tl.load(row + partner)
    if j < H:
        y = norm_rope(x, xp, QW, QW + partner, cos, sin, sign, d, eps, HD, ROT, HAS_QN)
        tl.store(QOUT + (t * H + j) * HD + d, y)
    else:
        kh = j - H
        y = norm_rope(x, xp, KW, KW + partner, cos, sin, sign, d, eps, HD, ROT, HAS_KN)
        slot = tl.load(SLOT + t).to(tl.int64)
        tl.store(KC + slot * stride_kc + kh * HD + d, y.to(KC.dtype.element_ty))
        v = tl.load(QKV + t * stride_t + (H + HKV + kh) * HD + d)
        tl.store(VC + slot * stride_vc + kh * HD + d, v.to(VC.dtype.element_ty))


def qkv_rope_triton(
    qkv: torch.Tensor,  # [T, (H + 2*Hkv) * hd] the fused projection (q | k | v)
    positions: torch.Tensor,  # [T] int64
    slot_mapping: torch.Tensor,  # [T] int64 flat KV slots
    cos: torch.Tensor,  # [P, rot] float32 (rotary's tables, attention scaling included)
    sin: torch.Tensor,
    q_norm: torch.Tensor | None,  # [hd] per-head weights
    k_norm: torch.Tensor | None,
    k_cache: torch.Tensor,  # [slots, Hkv, hd]
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> torch.Tensor:  # q [T, H, hd] in qkv's dtype
    T = qkv.shape[0]
    H, hkv, hd = num_heads, num_kv_heads, head_dim
    rot = int(cos.shape[1])
    if qkv.shape[1] != (H + 2 * hkv) * hd or qkv.stride(1) != 1:
        raise ValueError(f"qkv rope: rows of {qkv.shape[1]} for {H}+2x{hkv} heads of {hd}")
    if hd & (hd - 1) or rot % 2 or rot > hd:
        raise ValueError(f"qkv rope: head dim {hd} (a power of 2), rotary dim {rot}")
    if k_cache.stride(1) != hd or k_cache.stride(2) != 1 or v_cache.stride(1) != hd or v_cache.stride(2) != 1:
        raise ValueError("qkv rope: the KV pool's rows must be [Hkv, hd] contiguous")
    q = torch.empty((T, H, hd), dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q
    qw = q_norm.to(qkv.dtype).contiguous() if q_norm is not None else q
    kw = k_norm.to(qkv.dtype).contiguous() if k_norm is not None else q
    _qkv_rope_kernel[(T, H + hkv)](
        qkv, positions, slot_mapping, cos, sin, qw, kw, q, k_cache, v_cache,
        qkv.stride(0), k_cache.stride(0), v_cache.stride(0), eps,
        H=H, HKV=hkv, HD=hd, ROT=rot, HAS_QN=q_norm is not None, HAS_KN=k_norm is not None,
    )  # fmt: skip
    return q
