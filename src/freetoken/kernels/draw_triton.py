"""The sampler's draw (``runner/sampler.py``) in three small Triton launches instead of ~12 torch kernels over the
vocabulary: per row, ``argmax((x - max x) / temperature + g)`` with Gumbel noise ``g = -log(-log(u))`` from the
counter-based hash of ``runner/noise.py`` (computed here per token, bit-exact), greedy rows ``argmax x``.

The row is split in blocks of ``BLOCK`` tokens, one program each (a decode step has 1-8 rows: one program per row
would leave the GPU almost idle): pass 1 takes each block's max and its first index; pass 2 reduces the row's
max from pass 1's partials, then each block's best ``z + g`` and its first index (greedy rows skip it); pass 3,
one program per row, picks the best block (the first on ties: torch.argmax's lowest index). A row's key
(``noise.row_keys``) and whether it is greedy (temperature < 1e-5, as ``sampler.sample_batch``) are computed in the
launches from its seed halves, step and temperature: no torch ops around them (each a launch of its own in the step's
CUDA graph: ~15 of them took ~40 µs a step, the draw's larger part, ``bench/gpu/sample_time.py``).

The hash runs in uint32 arithmetic: ``noise.mix32`` computes over int64 ``(x * c) & 0xFFFFFFFF`` with ``x`` and
``c`` below 2**32, which is the uint32 product modulo 2**32, and its shifts of non-negative values are logical
shifts; the same bits, in native 32-bit ops. The logs are libdevice's ``logf`` on the GPU, as torch's (``tl.log``
is the approximate ``lg2.approx``, whose absolute error near ``u = 1`` is large against ``-log(u)`` itself); the
interpreter, which has no libdevice, takes numpy's.

NaN and -inf are never picked: a NaN compares false and a block or row of only -inf (or NaN) keeps the sentinel
index ``V``, which pass 3 maps to 0 (torch.argmax of an all -inf row: 0). A torch reference would pick a NaN."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

BLOCK = 2048
PRECISE_LOG = os.environ.get("TRITON_INTERPRET") != "1"  # libdevice's log on the GPU; the interpreter has none


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    return x ^ (x >> 15)


@triton.jit
def _row_key(LO, HI, STEP, row):
    """``noise.row_keys`` of one row, in uint32 (its int64 ops on values below 2**32 are these)."""
    step = tl.load(STEP + row).to(tl.uint32)  # the low 32 bits: ``step & 0xFFFFFFFF``
    return _mix32(tl.load(LO + row).to(tl.uint32) ^ _mix32(tl.load(HI + row).to(tl.uint32) ^ _mix32(step)))


@triton.jit
def _greedy(T, row, UNIT: tl.constexpr):
    """Whether a row is greedy: temperature below 1e-5 (``UNIT``: no row is, every temperature 1)."""
    if UNIT:
        g = False
    else:
        g = tl.load(T + row) < 1e-5
    return g


@triton.jit
def _log(x, PRECISE: tl.constexpr):
    if PRECISE:
        y = libdevice.log(x)
    else:
        y = tl.log(x)
    return y


@triton.jit
def gumbel(LO, HI, STEP, row, cols, PRECISE: tl.constexpr):
    """The row's Gumbel noise at tokens ``cols``: ``-log(-log(u))``, u from the counter-based hash."""
    h = _mix32(_row_key(LO, HI, STEP, row) ^ _mix32(cols.to(tl.uint32) + 0x9E3779B9))
    u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    return -_log(-_log(u, PRECISE), PRECISE)


@triton.jit
def block_best(v, cols, V):
    """(max of v, the first of its indices), NaN ignored; (-inf, V) where v has nothing above -inf."""
    v = tl.where(v == v, v, float("-inf"))
    m = tl.max(v, axis=0)
    i = tl.min(tl.where(v == m, cols, V), axis=0)
    return m, tl.where(m > float("-inf"), i, V)


@triton.jit
def _max_kernel(X, PM, PI, V, stride, NB, BLOCK: tl.constexpr):
    row, blk = tl.program_id(0), tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row.to(tl.int64) * stride + cols, mask=cols < V, other=float("-inf"))
    m, i = block_best(x, cols, V)
    tl.store(PM + row * NB + blk, m)
    tl.store(PI + row * NB + blk, i)


@triton.jit
def _draw_kernel(
    X, T, LO, HI, STEP, PM, DM, DI, V, stride, NB, NB_POW: tl.constexpr, BLOCK: tl.constexpr,
    PRECISE: tl.constexpr, UNIT: tl.constexpr,
):  # fmt: skip
    row, blk = tl.program_id(0), tl.program_id(1)
    if not _greedy(T, row, UNIT):
        parts = tl.arange(0, NB_POW)
        pm = tl.load(PM + row * NB + parts, mask=parts < NB, other=float("-inf"))
        x_max = tl.max(pm, axis=0)  # the partials hold no NaN
        cols = blk * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + row.to(tl.int64) * stride + cols, mask=cols < V, other=float("-inf"))
        if UNIT:
            z = x - x_max
        else:
            z = (x - x_max) / tl.load(T + row)
        m, i = block_best(z + gumbel(LO, HI, STEP, row, cols, PRECISE), cols, V)
        tl.store(DM + row * NB + blk, m)
        tl.store(DI + row * NB + blk, i)


@triton.jit
def pick_kernel(T, PM, PI, DM, DI, OUT, V, NB, NB_POW: tl.constexpr, UNIT: tl.constexpr):
    row = tl.program_id(0)
    parts = tl.arange(0, NB_POW)
    ok = parts < NB
    if _greedy(T, row, UNIT):
        m = tl.load(PM + row * NB + parts, mask=ok, other=float("-inf"))
        i = tl.load(PI + row * NB + parts, mask=ok, other=V)
    else:
        m = tl.load(DM + row * NB + parts, mask=ok, other=float("-inf"))
        i = tl.load(DI + row * NB + parts, mask=ok, other=V)
    best = tl.max(m, axis=0)  # the partials hold no NaN
    idx = tl.min(tl.where(m == best, i, V), axis=0)
    tl.store(OUT + row, tl.where(idx < V, idx, 0).to(tl.int64))


def gumbel_argmax_triton(
    x: torch.Tensor, temperature: torch.Tensor, seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor,
    unit: bool = False,
) -> torch.Tensor:
    """x [B, V] float32, temperature [B] float32, the rows' seed halves and steps [B] int64 (``SamplingBatch``'s)
    -> [B] int64 token ids: rows at temperature < 1e-5 greedy, the others drawn at theirs (``unit``: every row drawn at
    temperature 1, whatever its own). Fixed-shape launches, no host read: capturable in a CUDA graph."""
    B, V = x.shape
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"gumbel_argmax: x must be float32 with unit column stride, got {x.dtype} {x.stride()}")
    if V == 0 or V > 2**32 - 0x9E3779B9:  # the token counter + 0x9E3779B9 stays below 2**32, as in int64
        raise ValueError(f"gumbel_argmax: vocabulary of {V} tokens out of range")
    if temperature.dtype != torch.float32 or not all(t.dtype == torch.int64 for t in (seed_lo, seed_hi, step)):
        raise ValueError("gumbel_argmax: temperature must be float32, the seeds and steps int64")
    NB = triton.cdiv(V, BLOCK)
    nb_pow = max(2, triton.next_power_of_2(NB))
    dev = x.device
    pm = torch.empty((B, NB), dtype=torch.float32, device=dev)
    pi = torch.empty((B, NB), dtype=torch.int32, device=dev)
    dm, di = torch.empty_like(pm), torch.empty_like(pi)
    out = torch.empty(B, dtype=torch.int64, device=dev)
    if B == 0:
        return out
    t, lo, hi, st = (v.contiguous() for v in (temperature, seed_lo, seed_hi, step))  # (views where they already are)
    _max_kernel[(B, NB)](x, pm, pi, V, x.stride(0), NB, BLOCK=BLOCK)
    _draw_kernel[(B, NB)](x, t, lo, hi, st, pm, dm, di, V, x.stride(0), NB, NB_POW=nb_pow, BLOCK=BLOCK,
                          PRECISE=PRECISE_LOG, UNIT=unit)  # fmt: skip
    pick_kernel[(B,)](t, pm, pi, dm, di, out, V, NB, NB_POW=nb_pow, UNIT=unit)
    return out
