"""The sampler's penalties (``runner/sampler.py::apply_penalties``: repetition, presence, frequency) in one launch:
one program per block of a row's tokens reads the logits, the row's counts and seen flags in the penalty state
(``PenaltyState``, its row ``rows[b]``) and writes the penalised logits, where the torch path takes eight ops over
``[B, V]``. The same arithmetic (the compiler may contract a multiply and a subtract into one rounding). Fixed
shapes, no host read: capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _penalty_kernel(X, C, S, ROWS, REP, PRES, FREQ, OUT, V, stride, BLOCK: tl.constexpr):
    row, blk = tl.program_id(0), tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    ok = cols < V
    x = tl.load(X + row.to(tl.int64) * stride + cols, mask=ok, other=0.0)
    state = tl.load(ROWS + row) * V
    c = tl.load(C + state + cols, mask=ok, other=0).to(tl.float32)
    seen = tl.load(S + state + cols, mask=ok, other=0) != 0
    r = tl.load(REP + row)
    x = tl.where(seen, tl.where(x > 0, x / r, x * r), x)
    x = x - tl.load(PRES + row) * tl.where(c > 0, 1.0, 0.0) - tl.load(FREQ + row) * c
    tl.store(OUT + row.to(tl.int64) * V + cols, x, mask=ok)


def penalties_triton(
    x: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, rows: torch.Tensor, repetition: torch.Tensor,
    presence: torch.Tensor, frequency: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """x [B, V] float32 logits; counts [R, V] int32 and seen [R, V] bool (contiguous: the penalty state); rows [B]
    int64 (each row's state row); the rows' repetition, presence and frequency penalties [B] float32 -> the
    penalised logits [B, V] float32 (a new tensor)."""
    B, V = x.shape
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"penalties: x must be float32 with unit column stride, got {x.dtype} {x.stride()}")
    if counts.dtype != torch.int32 or seen.dtype != torch.bool or counts.shape[1] != V or seen.shape != counts.shape:
        raise ValueError(f"penalties: a state of int32 counts and bool flags [R, {V}] expected")
    out = torch.empty((B, V), dtype=torch.float32, device=x.device)
    if B == 0 or V == 0:
        return out
    f32 = [t.to(torch.float32).contiguous() for t in (repetition, presence, frequency)]
    _penalty_kernel[(B, triton.cdiv(V, BLOCK))](x, counts.contiguous(), seen.contiguous().view(torch.uint8),
                                                rows.contiguous(), *f32, out, V, x.stride(0), BLOCK=BLOCK)  # fmt: skip
    return out
