"""Rotary embeddings applied to q / k rows in one Triton launch per call, for CUDA, in the two layouts the torch paths
use: DeepSeek-V4's interleaved pairs (channels 2i and 2i + 1 of a head's *trailing* ``rot`` channels, by the position's
angle or its negative: ``layers/v4_rope.py``) and the half-split pairs (channels i and i + rot / 2 of the *leading*
``rot`` channels: ``layers/rope.py``'s ``Rotary``, MLA's and DSA's rope). The other channels pass through. The torch
paths are 9–12 launches a call (gathers, halves, products, concatenations), several calls a layer. Float32 arithmetic
rounded to x's dtype once (the torch half-split path rounds each product in x's dtype: last bits in bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(
    X, POS, COS, SIN, Y, M, hd, rot, table_stride, sign, INTERLEAVED: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # token row // M, head row % M
    p = tl.load(POS + row // M).to(tl.int64)
    base = row.to(tl.int64) * hd
    n_pass = hd - rot
    first = 0 if INTERLEAVED else rot  # the channels that pass through: [first, first + n_pass)
    c = first + tl.arange(0, BLOCK_N)
    keep = c < first + n_pass
    tl.store(Y + base + c, tl.load(X + base + c, mask=keep), mask=keep)
    half = rot // 2
    i = tl.arange(0, BLOCK_R)
    m = i < half
    if INTERLEAVED:  # pair i: channels n_pass + 2i, n_pass + 2i + 1
        ia, ib = n_pass + 2 * i, n_pass + 2 * i + 1
    else:  # pair i: channels i, half + i
        ia, ib = i, half + i
    a = tl.load(X + base + ia, mask=m, other=0.0).to(tl.float32)
    b = tl.load(X + base + ib, mask=m, other=0.0).to(tl.float32)
    cos = tl.load(COS + p * table_stride + i, mask=m, other=0.0).to(tl.float32)
    sin = tl.load(SIN + p * table_stride + i, mask=m, other=0.0).to(tl.float32) * sign
    tl.store(Y + base + ia, (a * cos - b * sin).to(Y.dtype.element_ty), mask=m)
    tl.store(Y + base + ib, (b * cos + a * sin).to(Y.dtype.element_ty), mask=m)


def _launch(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, half_cols: int,
    interleaved: bool, sign: float,
) -> torch.Tensor:  # fmt: skip
    T, hd = positions.shape[0], x.shape[-1]
    ok = x.dim() >= 2 and x.shape[0] == T and rot % 2 == 0 and 0 < rot <= hd and cos.shape[-1] == half_cols
    if not ok or cos.shape != sin.shape or cos.dtype != torch.float32:
        raise ValueError(f"rope: x {tuple(x.shape)}, {T} positions, rot {rot}, table {tuple(cos.shape)}")
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // hd
    if rows:
        _rope_kernel[(rows,)](
            xc, positions.contiguous(), cos, sin, y, rows // T, hd, rot, cos.stride(0), sign, INTERLEAVED=interleaved,
            BLOCK_N=triton.next_power_of_2(max(hd - rot, 1)), BLOCK_R=triton.next_power_of_2(rot // 2),
        )  # fmt: skip
    return y


def interleaved_rope_triton(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, inverse: bool = False
) -> torch.Tensor:
    """x [T, ..., hd] with its last ``rot`` channels rotated in interleaved pairs by ``positions`` [T] (cos / sin:
    float32 [P, rot / 2]); ``inverse``: by the negative angle."""
    return _launch(x, positions, cos, sin, rot, rot // 2, True, -1.0 if inverse else 1.0)


def half_rope_triton(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, ..., hd] with its first ``rot`` channels rotated in half-split pairs by ``positions`` [T] (cos / sin:
    float32 [P, rot], the halves repeated, as ``Rotary`` keeps them)."""
    rot = cos.shape[-1]
    return _launch(x, positions, cos, sin, rot, rot, False, 1.0)
