"""The sampler's top-p / min-p cut (``runner/sampler.py::_cut``) without sorting the vocabulary: per row, the
smallest kept logit found by a radix select over the logits' float bits, then one masking pass, which either writes
the cut logits or draws from them (``nucleus_draw_triton``: the draw of ``draw_triton.py`` on the kept tokens).

A row's temperature-scaled logits are ``z = (x - max x) / t`` (``t`` its temperature; a greedy row's, below 1e-5, is
cut at 1), so ``w = exp(z)`` are its unnormalised probabilities (best 1) and ``S = sum w``. The sorted cut keeps a
token when the probability mass ranked before it is at most ``top_p``: with ``key`` the logit's order-preserving
uint32 (of x: z ranks the tokens as x does), token i is kept iff ``W(key > key_i) <= top_p * S``, an upper set of
keys, so it is ``key >= k*`` for the smallest kept key ``k*``. The select finds ``k*`` four bits at a time, most
significant first (8 levels): level l's programs (one per block of ``BLOCK`` tokens) sum ``w`` and count tokens per
16 values of the next 4 bits, among the tokens whose higher bits match the prefix chosen so far; the next level's
programs each reduce those partial histograms in the same fixed order (the same bits in every program and every run:
no atomics) and take the lowest digit whose bin holds a token and whose mass above (the mass above the prefix's range
plus the bins above it) is at most ``top_p * S``. Level 0 needs no row max first: each block sums its masses against
its own max, which level 1 scales to the row's (and every later level reduces the blocks' maxima again). Min-p keeps
``w >= min_p`` (the sorted cut's ``p >= min_p * p_max`` with ``p_max = 1 / S``). The best token always stays.

What differs from the sort: the masses are summed in another order (a token whose mass ranked before it is within
float32 rounding of ``top_p * S`` may go the other way), and tokens tied at ``k*`` are all kept (the sort keeps those
its order puts first). Launches: 8 histogram levels and the masking pass (and the draw's pick), fixed shapes, no
host read: capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.draw_triton import PRECISE_LOG, block_best, gumbel, pick_kernel

# Tokens per program and warps (the launches' defaults): the fastest of bench/gpu/sample_time.py's sweep at V = 151,936
# (H100, 2026-12-07: the cut alone 39.5 / 81.7 µs at batch 1 / 4, against 59.5 / 142.3 at 2,048 tokens and 4 warps)
BLOCK = 1024
NUM_WARPS = 4
LEVELS = 8  # 4 bits each


@triton.jit
def _keys(x):
    """float32 -> uint32 in the same order (negatives: every bit flipped; the others: the sign bit set)."""
    u = x.to(tl.uint32, bitcast=True)
    return tl.where((u >> 31) != 0, u ^ 0xFFFFFFFF, u | 0x80000000)


@triton.jit
def _temp(T, row):
    """The row's cut temperature: its own, 1 for a greedy row (below 1e-5)."""
    t = tl.load(T + row)
    return tl.where(t < 1e-5, 1.0, t)


@triton.jit
def _row_max(PM, row, NB, NB_POW: tl.constexpr):
    """The row's max logit, from level 0's block maxima (the same order in every program)."""
    parts = tl.arange(0, NB_POW)
    return tl.max(tl.load(PM + row * NB + parts, mask=parts < NB, other=float("-inf")), axis=0)


@triton.jit
def _choose(PH, PC, PM, SP, SA, SS, TP, t, row, blk, B, NB, LEVEL: tl.constexpr, NB_POW: tl.constexpr):
    """Level LEVEL's prefix (the bits above its digit) and the mass above its range, from level LEVEL - 1's partial
    histograms (buffer (LEVEL - 1) % 2: level LEVEL writes the other); program 0 of the row stores them in state slot
    LEVEL, for the next level. Level 0's partial masses are against each block's own max: level 1 scales them."""
    parts = tl.arange(0, NB_POW)
    bins = tl.arange(0, 16)
    at = (((LEVEL - 1) % 2) * B * NB + row * NB + parts)[:, None] * 16 + bins[None, :]
    ok = (parts < NB)[:, None]
    hp = tl.load(PH + at, mask=ok, other=0.0)
    if LEVEL == 1:
        mb = tl.load(PM + row * NB + parts, mask=parts < NB, other=float("-inf"))
        scale = tl.exp((mb - tl.max(mb, axis=0)) / t)
        hp = tl.where((mb > float("-inf"))[:, None], hp * scale[:, None], 0.0)
    h = tl.sum(hp, axis=0)  # [16], the same order in every program
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
def _level_kernel(X, T, TP, PH, PC, PM, SP, SA, SS, V, stride, B, NB, LEVEL: tl.constexpr, NB_POW: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    """Partial histograms of digit LEVEL (bits 28 - 4 LEVEL .. 31 - 4 LEVEL) over the block's tokens in the range
    (level 0: also the block's max, its masses against it)."""
    row, blk = tl.program_id(0), tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row.to(tl.int64) * stride + cols, mask=cols < V, other=float("-inf"))
    t = _temp(T, row)
    key = _keys(x)
    inside = cols < V
    if LEVEL == 0:
        m = tl.max(tl.where(x == x, x, float("-inf")), axis=0)
        tl.store(PM + row * NB + blk, m)
    else:
        m = _row_max(PM, row, NB, NB_POW)
        prefix = _choose(PH, PC, PM, SP, SA, SS, TP, t, row, blk, B, NB, LEVEL, NB_POW)
        inside = inside & ((key >> (32 - 4 * LEVEL)) == prefix)
    digit = (key >> (28 - 4 * LEVEL)) & 15
    hit = (digit[:, None] == tl.arange(0, 16)[None, :].to(tl.uint32)) & inside[:, None]
    w = tl.exp((x - m) / t)
    out = ((LEVEL % 2) * B * NB + row * NB + blk) * 16 + tl.arange(0, 16)
    tl.store(PH + out, tl.sum(tl.where(hit, w[:, None], 0.0), axis=0))
    tl.store(PC + out, tl.sum(hit.to(tl.int32), axis=0))


@triton.jit
def _mask_kernel(X, T, TP, MP, PH, PC, PM, SP, SA, SS, OUT, LO, HI, STEP, XM, XI, DM, DI, V, stride, B, NB,
                 NB_POW: tl.constexpr, BLOCK: tl.constexpr, DRAW: tl.constexpr, PRECISE: tl.constexpr):  # fmt: skip
    """The smallest kept key from the last level, then the kept tokens (key >= it and w >= min_p): x where kept,
    else -inf, into OUT; or (DRAW) the draw's partials over them, as ``draw_triton``'s passes 1 and 2 take them from
    that output: the block's best kept x and its first index (XM, XI: a greedy row's pick), and its best kept
    ``z + g`` (DM, DI)."""
    row, blk = tl.program_id(0), tl.program_id(1)
    t = _temp(T, row)
    kmin = _choose(PH, PC, PM, SP, SA, SS, TP, t, row, blk, B, NB, 8, NB_POW)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row.to(tl.int64) * stride + cols, mask=cols < V, other=float("-inf"))
    z = (x - _row_max(PM, row, NB, NB_POW)) / t
    keep = (_keys(x) >= kmin) & (tl.exp(z) >= tl.load(MP + row))
    if DRAW:
        xm, xi = block_best(tl.where(keep, x, float("-inf")), cols, V)
        tl.store(XM + row * NB + blk, xm)
        tl.store(XI + row * NB + blk, xi)
        dm, di = block_best(tl.where(keep, z, float("-inf")) + gumbel(LO, HI, STEP, row, cols, PRECISE), cols, V)
        tl.store(DM + row * NB + blk, dm)
        tl.store(DI + row * NB + blk, di)
    else:
        tl.store(OUT + row.to(tl.int64) * V + cols, tl.where(keep, x, float("-inf")), mask=cols < V)


def _check(x: torch.Tensor, block: int) -> None:
    if block < 16 or block & (block - 1):
        raise ValueError(f"nucleus cut: block must be a power of 2 of at least 16, got {block}")
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"nucleus cut: x must be float32 with unit column stride, got {x.dtype} {x.stride()}")


def _select(x: torch.Tensor, t: torch.Tensor, top_p: torch.Tensor, block: int, num_warps: int) -> dict:
    """The 8 levels' launches; returns the buffers the masking pass reads."""
    B, V = x.shape
    NB = triton.cdiv(V, block)
    dev = x.device
    bufs = {
        "ph": torch.empty((2, B, NB, 16), dtype=torch.float32, device=dev),  # two levels' histograms, alternately
        "pc": torch.empty((2, B, NB, 16), dtype=torch.int32, device=dev),
        "pm": torch.empty((B, NB), dtype=torch.float32, device=dev),  # the blocks' max logits (level 0)
        "sp": torch.empty((B, LEVELS + 1), dtype=torch.int64, device=dev),  # the prefix after each level
        "sa": torch.empty((B, LEVELS + 1), dtype=torch.float32, device=dev),  # the mass above its range
        "ss": torch.empty(B, dtype=torch.float32, device=dev),  # top_p * S
        "nb": NB,
        "nb_pow": max(2, triton.next_power_of_2(NB)),
    }
    for level in range(LEVELS):
        _level_kernel[(B, NB)](x, t, top_p, bufs["ph"], bufs["pc"], bufs["pm"], bufs["sp"], bufs["sa"], bufs["ss"],
                               V, x.stride(0), B, NB, LEVEL=level, NB_POW=bufs["nb_pow"], BLOCK=block,
                               num_warps=num_warps)  # fmt: skip
    return bufs


def nucleus_cut_triton(x: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                       temperature: torch.Tensor | None = None, *, block: int = BLOCK,
                       num_warps: int = NUM_WARPS) -> torch.Tensor:  # fmt: skip
    """x [B, V] float32 logits, top_p, min_p [B] float32, temperature [B] float32 (None: 1; below 1e-5: a greedy
    row, cut at 1) -> x with the cut tokens at -inf. ``block`` (a power of 2 of at least 16) tokens per program; the
    same kept set whatever it is."""
    _check(x, block)
    B, V = x.shape
    out = torch.empty((B, V), dtype=torch.float32, device=x.device)
    if B == 0 or V == 0:
        return out
    t = torch.ones(B, device=x.device) if temperature is None else temperature.to(torch.float32).contiguous()
    tp, mp = top_p.to(torch.float32).contiguous(), min_p.to(torch.float32).contiguous()
    s = _select(x, t, tp, block, num_warps)
    _mask_kernel[(B, s["nb"])](x, t, tp, mp, s["ph"], s["pc"], s["pm"], s["sp"], s["sa"], s["ss"], out, x, x, x, x,
                               x, x, x, V, x.stride(0), B, s["nb"], NB_POW=s["nb_pow"], BLOCK=block, DRAW=False,
                               PRECISE=PRECISE_LOG, num_warps=num_warps)  # fmt: skip
    return out


def nucleus_draw_triton(x: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                        seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``draw_triton.gumbel_argmax_triton(nucleus_cut_triton(x, top_p, min_p, temperature), temperature, ...)``
    with no cut logits written: the masking pass takes the draw's partials itself. [B] int64 token ids; a greedy
    row's is its argmax."""
    _check(x, BLOCK)
    B, V = x.shape
    if V > 2**32 - 0x9E3779B9:  # the draw's token counter + 0x9E3779B9 stays below 2**32
        raise ValueError(f"nucleus draw: vocabulary of {V} tokens out of range")
    if not all(v.dtype == torch.int64 for v in (seed_lo, seed_hi, step)):
        raise ValueError("nucleus draw: the seeds and steps must be int64")
    out = torch.empty(B, dtype=torch.int64, device=x.device)
    if B == 0 or V == 0:
        return out
    t = temperature.to(torch.float32).contiguous()
    tp, mp = top_p.to(torch.float32).contiguous(), min_p.to(torch.float32).contiguous()
    s = _select(x, t, tp, BLOCK, NUM_WARPS)
    nb = s["nb"]
    xm, dm = (torch.empty((B, nb), dtype=torch.float32, device=x.device) for _ in range(2))
    xi, di = (torch.empty((B, nb), dtype=torch.int32, device=x.device) for _ in range(2))
    lo, hi, st = (v.contiguous() for v in (seed_lo, seed_hi, step))
    _mask_kernel[(B, nb)](x, t, tp, mp, s["ph"], s["pc"], s["pm"], s["sp"], s["sa"], s["ss"], x, lo, hi, st, xm, xi,
                          dm, di, V, x.stride(0), B, nb, NB_POW=s["nb_pow"], BLOCK=BLOCK, DRAW=True,
                          PRECISE=PRECISE_LOG, num_warps=NUM_WARPS)  # fmt: skip
    pick_kernel[(B,)](t, xm, xi, dm, di, out, V, nb, NB_POW=s["nb_pow"], UNIT=False)
    return out
