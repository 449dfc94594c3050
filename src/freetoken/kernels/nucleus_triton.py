"""The sampler's top-p / min-p cut (``runner/sampler.py::_cut``) without sorting the vocabulary: per row, the
smallest kept logit found by a radix select over the logits' float bits, then one masking pass.

Each program computes a row's temperature-scaled logits ``z = (x - max x) / t`` from the logits ``x`` [B, V] as it
loads them (``t`` the row's temperature, 1 for a greedy row's, below 1e-5), so ``w = exp(z)`` are the row's
unnormalised probabilities (best 1) and ``S = sum w``; the output is ``x`` with the cut tokens at -inf, which the draw
(``draw_triton.py``) shifts and scales itself: no torch ops over the vocabulary around the cut. The sorted cut keeps a
token when the probability mass ranked before it is at most ``top_p``: with ``key`` the logit's order-preserving
uint32, token i is kept iff ``W(key > key_i) <= top_p * S``, an upper set of keys, so it is ``key >= k*`` for the
smallest kept key ``k*``. The select finds ``k*`` four bits at a time, most significant first (8 levels): level l's
programs (one per block of ``BLOCK`` tokens) sum ``w`` and count tokens per 16 values of the next 4 bits, among the
tokens whose higher bits match the prefix chosen so far; the next level's programs each reduce those partial
histograms in the same fixed order (the same bits in every program and every run: no atomics) and take the lowest
digit whose bin holds a token and whose mass above (the mass above the prefix's range plus the bins above it) is at
most ``top_p * S``. Min-p keeps ``w >= min_p`` (the sorted cut's ``p >= min_p * p_max`` with ``p_max = 1 / S``). The
best token always stays.

What differs from the sort: the masses are summed in another order (a token whose mass ranked before it is within
float32 rounding of ``top_p * S`` may go the other way), and tokens tied at ``k*`` are all kept (the sort keeps those
its order puts first). Launches: the rows' max, 8 histogram levels and one masking pass, fixed shapes, no host
read: capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tokens per program and warps (the launches' defaults): the fastest of bench/gpu/sample_time.py's sweep at V = 151,936
# (H100, 2026-12-07: the cut alone 39.5 / 81.7 µs at batch 1 / 4, against 59.5 / 142.3 at 2,048 tokens and 4 warps)
BLOCK = 1024
NUM_WARPS = 4
LEVELS = 8  # 4 bits each


@triton.jit
def _keys(z):
    """float32 -> uint32 in the same order (negatives: every bit flipped; the others: the sign bit set)."""
    u = z.to(tl.uint32, bitcast=True)
    return tl.where((u >> 31) != 0, u ^ 0xFFFFFFFF, u | 0x80000000)


@triton.jit
def _row_z(X, M, T, row, cols, V, stride):
    """A block of the row's logits x and their z = (x - max x) / t (a greedy row's t: 1)."""
    x = tl.load(X + row.to(tl.int64) * stride + cols, mask=cols < V, other=float("-inf"))
    t = tl.load(T + row)
    return x, (x - tl.load(M + row)) / tl.where(t < 1e-5, 1.0, t)


@triton.jit
def _choose(PH, PC, SP, SA, SS, TP, row, blk, B, NB, LEVEL: tl.constexpr, NB_POW: tl.constexpr):
    """Level LEVEL's prefix (the bits above its digit) and the mass above its range, from level LEVEL - 1's partial
    histograms (buffer (LEVEL - 1) % 2: level LEVEL writes the other); program 0 of the row stores them in state slot
    LEVEL, for the next level."""
    parts = tl.arange(0, NB_POW)
    bins = tl.arange(0, 16)
    at = (((LEVEL - 1) % 2) * B * NB + row * NB + parts)[:, None] * 16 + bins[None, :]
    ok = (parts < NB)[:, None]
    h = tl.sum(tl.load(PH + at, mask=ok, other=0.0), axis=0)  # [16], the same order in every program
    c = tl.sum(tl.load(PC + at, mask=ok, other=0), axis=0)
    if LEVEL == 1:
        prefix = tl.zeros((), dtype=tl.uint32)
        above = tl.zeros((), dtype=tl.float32)
        limit = tl.load(TP + row) * tl.sum(h, axis=0)  # top_p * S
    else:
        prefix = tl.load(SP + row * 9 + LEVEL - 1).to(tl.uint32)
        above = tl.load(SA + row * 9 + LEVEL - 1)
        limit = tl.load(SS + row)
    over = tl.sum(h, axis=0) - tl.cumsum(h, axis=0)  # mass of the bins above each bin
    fits = (above + over <= limit) & (c > 0)
    d = tl.min(tl.where(fits, bins, 16), axis=0)
    # the range's top bin fits by the last level's choice; should rounding say otherwise, take it
    d = tl.where(d < 16, d, tl.max(tl.where(c > 0, bins, 0), axis=0))
    above = above + tl.sum(tl.where(bins == d, over, 0.0), axis=0)  # the very sum the test above compared
    prefix = (prefix << 4) | d.to(tl.uint32)
    if blk == 0:
        tl.store(SP + row * 9 + LEVEL, prefix.to(tl.int64))
        tl.store(SA + row * 9 + LEVEL, above)
        if LEVEL == 1:
            tl.store(SS + row, limit)
    return prefix


@triton.jit
def _level_kernel(X, M, T, TP, PH, PC, SP, SA, SS, V, stride, B, NB, LEVEL: tl.constexpr, NB_POW: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    """Partial histograms of digit LEVEL (bits 28 - 4 LEVEL .. 31 - 4 LEVEL) over the block's tokens in the range."""
    row, blk = tl.program_id(0), tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    _, z = _row_z(X, M, T, row, cols, V, stride)
    key = _keys(z)
    inside = cols < V
    if LEVEL > 0:
        prefix = _choose(PH, PC, SP, SA, SS, TP, row, blk, B, NB, LEVEL, NB_POW)
        inside = inside & ((key >> (32 - 4 * LEVEL)) == prefix)
    digit = (key >> (28 - 4 * LEVEL)) & 15
    hit = (digit[:, None] == tl.arange(0, 16)[None, :].to(tl.uint32)) & inside[:, None]
    w = tl.exp(z)
    out = ((LEVEL % 2) * B * NB + row * NB + blk) * 16 + tl.arange(0, 16)
    tl.store(PH + out, tl.sum(tl.where(hit, w[:, None], 0.0), axis=0))
    tl.store(PC + out, tl.sum(hit.to(tl.int32), axis=0))


@triton.jit
def _mask_kernel(X, M, T, TP, MP, PH, PC, SP, SA, SS, OUT, V, stride, B, NB, NB_POW: tl.constexpr,
                 BLOCK: tl.constexpr):  # fmt: skip
    """The smallest kept key from the last level, then x where kept (key >= it and w >= min_p), else -inf."""
    row, blk = tl.program_id(0), tl.program_id(1)
    kmin = _choose(PH, PC, SP, SA, SS, TP, row, blk, B, NB, 8, NB_POW)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x, z = _row_z(X, M, T, row, cols, V, stride)
    keep = (_keys(z) >= kmin) & (tl.exp(z) >= tl.load(MP + row))
    tl.store(OUT + row.to(tl.int64) * V + cols, tl.where(keep, x, float("-inf")), mask=cols < V)


def nucleus_cut_triton(x: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                       temperature: torch.Tensor | None = None, *, block: int = BLOCK,
                       num_warps: int = NUM_WARPS) -> torch.Tensor:  # fmt: skip
    """x [B, V] float32 logits, top_p, min_p [B] float32, temperature [B] float32 (None: 1; below 1e-5: a greedy
    row, cut at 1) -> x with the cut tokens at -inf. ``block`` (a power of 2 of at least 16) tokens per program; the
    same kept set whatever it is."""
    B, V = x.shape
    if block < 16 or block & (block - 1):
        raise ValueError(f"nucleus cut: block must be a power of 2 of at least 16, got {block}")
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"nucleus cut: x must be float32 with unit column stride, got {x.dtype} {x.stride()}")
    NB = triton.cdiv(V, block)
    nb_pow = max(2, triton.next_power_of_2(NB))
    dev = x.device
    out = torch.empty((B, V), dtype=torch.float32, device=dev)
    if B == 0 or V == 0:
        return out
    ph = torch.empty((2, B, NB, 16), dtype=torch.float32, device=dev)  # two levels' partial histograms, alternately
    pc = torch.empty((2, B, NB, 16), dtype=torch.int32, device=dev)
    sp = torch.empty((B, LEVELS + 1), dtype=torch.int64, device=dev)  # the prefix after each level
    sa = torch.empty((B, LEVELS + 1), dtype=torch.float32, device=dev)  # the mass above its range
    ss = torch.empty(B, dtype=torch.float32, device=dev)  # top_p * S
    tp, mp = top_p.to(torch.float32).contiguous(), min_p.to(torch.float32).contiguous()
    t = torch.ones(B, device=dev) if temperature is None else temperature.to(torch.float32).contiguous()
    m = torch.amax(x, dim=1)  # the rows' max: one reduction launch
    for level in range(LEVELS):
        _level_kernel[(B, NB)](x, m, t, tp, ph, pc, sp, sa, ss, V, x.stride(0), B, NB, LEVEL=level, NB_POW=nb_pow,
                               BLOCK=block, num_warps=num_warps)  # fmt: skip
    _mask_kernel[(B, NB)](x, m, t, tp, mp, ph, pc, sp, sa, ss, out, V, x.stride(0), B, NB, NB_POW=nb_pow,
                          BLOCK=block, num_warps=num_warps)  # fmt: skip
    return out
