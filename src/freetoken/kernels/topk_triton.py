"""The sampler's top-k cut (``runner/sampler.py::_cut`` with ``Features.top_k``: then top-p and min-p over the k
kept) without sorting the vocabulary, and the draw from it, in two launches.

Every drawn row of such a step keeps at most ``K`` tokens (``Features.top_k``, a power of two): so only a row's ``K``
best logits matter. Launch 1, one program per block of ``BLOCK`` tokens of a row, takes the block's ``K`` best (``K``
rounds of max and first index, each taking the found token out), best first. Launch 2, one program per row, takes
the row's ``K`` best from those candidates the same way: ``x`` sorted descending, ties by the lower token id (the
order ``torch.topk`` gives on distinct values). Over those ``K`` it applies the sorted cut: ``z = (x - max x) / t``
(``t`` the row's temperature, a greedy row's 1), rank below the row's own top-k, the softmax of the ranked ones, the
mass ranked before a token at most ``top_p``, ``p >= min_p * p_max``, the best always kept. A drawn row's token is the
kept one with the largest ``z + g`` (``g``: ``draw_triton.gumbel`` at its token id, ties the lower id), exactly the
draw of ``draw_triton`` on the cut logits; a greedy row's is its best token, as ``argmax`` gives it.

What can differ from the torch cut: the softmax and its cumulative sums in another order (a token whose mass ranked
before it is within float32 rounding of ``top_p`` may go the other way), and which of tokens tied at the ``K``-th
value stays. Fixed shapes, no host read: capturable in the step graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.draw_triton import PRECISE_LOG, block_best, gumbel

BLOCK = 4096  # tokens per launch-1 program
K_LIMIT = 64  # the largest Features.top_k this path takes (K rounds a program; above: torch.topk)


@triton.jit
def block_topk_kernel(X, CV, CI, PM, PS, V, stride, NB, K: tl.constexpr, BLOCK: tl.constexpr, LSE: tl.constexpr):
    """The block's K best logits (NaN as -inf) and their token ids, best first; (-inf, V) past its finite ones.
    ``LSE``: also the block's max logit and sum of ``exp(x - max)`` (``logprobs_triton``'s normaliser)."""
    row, blk = tl.program_id(0), tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row.to(tl.int64) * stride + cols, mask=cols < V, other=float("-inf"))
    x = tl.where(x == x, x, float("-inf"))
    if LSE:
        m = tl.max(x, axis=0)
        tl.store(PM + row * NB + blk, m)
        shift = tl.where(m > float("-inf"), m, 0.0)  # a block of -inf only: no -inf - -inf
        tl.store(PS + row * NB + blk, tl.sum(tl.where(x > float("-inf"), tl.exp(x - shift), 0.0), axis=0))
    base = (row * NB + blk) * K
    for j in range(K):
        m, i = block_best(x, cols, V)
        tl.store(CV + base + j, m)
        tl.store(CI + base + j, i)
        x = tl.where(cols == i, float("-inf"), x)


@triton.jit
def row_topk(CV, CI, row, V, NC, K: tl.constexpr, NC_POW: tl.constexpr):
    """The row's K best (values, token ids) from its blocks' candidates, best first (ties: the lower token id)."""
    parts = tl.arange(0, NC_POW)
    cv = tl.load(CV + row * NC + parts, mask=parts < NC, other=float("-inf"))
    ci = tl.load(CI + row * NC + parts, mask=parts < NC, other=V)
    rank = tl.arange(0, K)
    xs = tl.full([K], float("-inf"), tl.float32)
    ids = tl.full([K], V, tl.int32)
    for j in range(K):
        m, i = block_best(cv, ci, V)
        xs = tl.where(rank == j, m, xs)
        ids = tl.where(rank == j, i, ids)
        cv = tl.where(ci == i, float("-inf"), cv)
    return xs, ids


@triton.jit
def _row_kernel(
    CV, CI, T, TK, TP, MP, LO, HI, STEP, ZK, IK, OUT, V, NC, K: tl.constexpr, NC_POW: tl.constexpr,
    PRECISE: tl.constexpr, DRAW: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    rank = tl.arange(0, K)
    xs, ids = row_topk(CV, CI, row, V, NC, K, NC_POW)
    t = tl.load(T + row)
    greedy = t < 1e-5
    t = tl.where(greedy, 1.0, t)
    x_max = tl.max(xs, axis=0)
    z = (xs - x_max) / t
    k = tl.load(TK + row)
    k = tl.where((k > 0) & (k < K), k, K)
    keep = (rank < k) & (ids < V)
    w = tl.where(keep, tl.exp(z), 0.0)
    p = w / tl.sum(w, axis=0)
    keep = keep & (tl.cumsum(p, axis=0) - p <= tl.load(TP + row))
    keep = keep & (p >= tl.load(MP + row) * tl.max(p, axis=0))
    keep = keep | (rank == 0)
    zk = tl.where(keep, z, float("-inf"))
    tl.store(ZK + row * K + rank, zk)
    tl.store(IK + row * K + rank, ids)
    if DRAW:
        best = tl.min(tl.where(xs == x_max, ids, V), axis=0)  # argmax's first index
        if not greedy:
            _, best = block_best(zk + gumbel(LO, HI, STEP, row, ids, PRECISE), ids, V)
        tl.store(OUT + row, tl.where(best < V, best, 0).to(tl.int64))


def _check(x: torch.Tensor, k: int) -> None:
    if k < 1 or k > K_LIMIT or k & (k - 1):
        raise ValueError(f"top-k cut: k must be a power of 2 from 1 to {K_LIMIT}, got {k}")
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"top-k cut: x must be float32 with unit column stride, got {x.dtype} {x.stride()}")
    if x.shape[1] > 2**31 - 1 or x.shape[1] > 2**32 - 0x9E3779B9:  # int32 ids; the draw's token counter
        raise ValueError(f"top-k cut: vocabulary of {x.shape[1]} tokens out of range")


def _launch(x: torch.Tensor, k: int, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
            min_p: torch.Tensor, seeds: tuple[torch.Tensor, ...] | None, block: int,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    _check(x, k)
    B, V = x.shape
    dev = x.device
    zk = torch.empty((B, k), dtype=torch.float32, device=dev)
    ik = torch.empty((B, k), dtype=torch.int32, device=dev)
    out = torch.empty(B, dtype=torch.int64, device=dev)
    if B == 0 or V == 0:
        return zk, ik, out
    NB = triton.cdiv(V, block)
    cv = torch.empty((B, NB * k), dtype=torch.float32, device=dev)
    ci = torch.empty((B, NB * k), dtype=torch.int32, device=dev)
    t, tk = temperature.to(torch.float32).contiguous(), top_k.to(torch.int64).contiguous()
    tp, mp = top_p.to(torch.float32).contiguous(), min_p.to(torch.float32).contiguous()
    lo, hi, st = (s.contiguous() for s in seeds) if seeds is not None else (tk, tk, tk)
    block_topk_kernel[(B, NB)](x, cv, ci, cv, cv, V, x.stride(0), NB, K=k, BLOCK=block, LSE=False)
    _row_kernel[(B,)](cv, ci, t, tk, tp, mp, lo, hi, st, zk, ik, out, V, NB * k, K=k,
                      NC_POW=max(2, triton.next_power_of_2(NB * k)), PRECISE=PRECISE_LOG,
                      DRAW=seeds is not None)  # fmt: skip
    return zk, ik, out


def topk_cut_triton(x: torch.Tensor, k: int, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                    min_p: torch.Tensor, *, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """x [B, V] float32 logits; ``k`` every row's bound (``Features.top_k``, a power of 2 up to ``K_LIMIT``); the rows'
    temperature, top_k (0 or above ``k``: ``k``), top_p, min_p [B] -> (z [B, k] float32: the row's ``k`` best as
    ``(x - max x) / t``, -inf where cut; ids [B, k] int32: their token ids, ``V`` past a row's finite logits), best
    first. ``block``: tokens per program of the first launch (the same result whatever it is)."""
    zk, ik, _ = _launch(x, k, temperature, top_k, top_p, min_p, None, block)
    return zk, ik


def topk_draw_triton(x: torch.Tensor, k: int, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor, seed_lo: torch.Tensor, seed_hi: torch.Tensor,
                     step: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``topk_cut_triton``'s cut and the draw from it (``draw_triton``'s, on the cut logits, at temperature 1 after
    the cut's own division) in the same two launches: [B] int64 token ids, a greedy row's its argmax."""
    if not all(s.dtype == torch.int64 for s in (seed_lo, seed_hi, step)):
        raise ValueError("top-k draw: the seeds and steps must be int64")
    return _launch(x, k, temperature, top_k, top_p, min_p, (seed_lo, seed_hi, step), BLOCK)[2]
