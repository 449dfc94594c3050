"""DeepSeek-V4's interleaved rotary (``layers/v4_rope.py``) in one Triton launch per call, for CUDA: channels 2i and
2i + 1 of a head's trailing ``rot`` channels rotate together by the position's angle (its negative for the inverse),
the leading channels pass through. The torch version is ~12 launches a call (gathers, strided halves, products, a
stack and a concatenation), five calls a layer. Same float32 arithmetic, rounded to x's dtype once (a product pair
may fuse into one FMA: last bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(X, POS, COS, SIN, Y, M, hd, rot, sign, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0)  # token row // M, head row % M
    p = tl.load(POS + row // M).to(tl.int64)
    base = row.to(tl.int64) * hd
    nope = hd - rot
    c = tl.arange(0, BLOCK_N)
    tl.store(Y + base + c, tl.load(X + base + c, mask=c < nope), mask=c < nope)
    half = rot // 2
    i = tl.arange(0, BLOCK_R)
    m = i < half
    even = tl.load(X + base + nope + 2 * i, mask=m, other=0.0).to(tl.float32)
    odd = tl.load(X + base + nope + 2 * i + 1, mask=m, other=0.0).to(tl.float32)
    cos = tl.load(COS + p * half + i, mask=m, other=0.0)
    sin = tl.load(SIN + p * half + i, mask=m, other=0.0) * sign
    tl.store(Y + base + nope + 2 * i, (even * cos - odd * sin).to(Y.dtype.element_ty), mask=m)
    tl.store(Y + base + nope + 2 * i + 1, (odd * cos + even * sin).to(Y.dtype.element_ty), mask=m)


def interleaved_rope_triton(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, inverse: bool = False
) -> torch.Tensor:
    """x [T, ..., hd] with its last ``rot`` channels rotated by ``positions`` [T] (cos / sin: float32 [P, rot / 2])."""
    T, hd = positions.shape[0], x.shape[-1]
    if x.shape[0] != T or rot % 2 or not 0 < rot <= hd or cos.shape[-1] != rot // 2 or cos.dtype != torch.float32:
        raise ValueError(f"interleaved rope: x {tuple(x.shape)}, {T} positions, rot {rot}, table {tuple(cos.shape)}")
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // hd
    if rows:
        _rope_kernel[(rows,)](
            xc, positions.contiguous(), cos, sin, y, rows // T, hd, rot, -1.0 if inverse else 1.0,
            BLOCK_N=triton.next_power_of_2(max(hd - rot, 1)), BLOCK_R=triton.next_power_of_2(rot // 2),
        )  # fmt: skip
    return y
