"""The sampler's logprobs (``runner/sampler.py::_with_logprobs``) without a full log-softmax or ``torch.topk`` over the
vocabulary, in two launches: the first is ``topk_triton.block_topk_kernel`` with its log-sum-exp partials (each block's
K best logits, its max logit and sum of ``exp(x - max)``), the second one program per row: the row's normaliser
``lse = M + log(sum_b s_b * exp(m_b - M))`` (``M`` the row's max), its K best as ``x - lse`` (best first, ties the
lower token id), and the sampled token's ``x[id] - lse``.

What differs from ``torch.log_softmax``: the sum in another order and ``x - lse`` where torch computes
``(x - M) - log(S)``: within float32 rounding (a few ulps of the logprob). Fixed shapes, no host read: capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.topk_triton import BLOCK, block_topk_kernel, row_topk


@triton.jit
def _row_kernel(
    X, IDS, CV, CI, PM, PS, LP, TV, TI, V, stride, NB, NC, K: tl.constexpr, NC_POW: tl.constexpr, NB_POW: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    parts = tl.arange(0, NB_POW)
    pm = tl.load(PM + row * NB + parts, mask=parts < NB, other=float("-inf"))
    ps = tl.load(PS + row * NB + parts, mask=parts < NB, other=0.0)
    m = tl.max(pm, axis=0)
    lse = m + tl.log(tl.sum(tl.where(pm > float("-inf"), ps * tl.exp(pm - m), 0.0), axis=0))
    xs, ids = row_topk(CV, CI, row, V, NC, K, NC_POW)
    rank = tl.arange(0, K)
    tl.store(TV + row * K + rank, xs - lse)
    tl.store(TI + row * K + rank, tl.where(ids < V, ids, 0).to(tl.int64))
    tok = tl.load(IDS + row)
    tl.store(LP + row, tl.load(X + row.to(tl.int64) * stride + tok) - lse)


def logprobs_triton(logits: torch.Tensor, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, V] float32, ids [B] int64 (the sampled tokens), ``n`` top logprobs a row (at most 64) -> (logprob
    [B] of ``ids``, top logprobs [B, n] float32 best first, their ids [B, n] int64)."""
    B, V = logits.shape
    if logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(f"logprobs: logits must be float32 with unit column stride, got {logits.dtype}")
    if not 1 <= n <= 64 or V > 2**31 - 1:
        raise ValueError(f"logprobs: {n} top logprobs of a {V}-token vocabulary out of range")
    k = max(2, triton.next_power_of_2(n))
    dev = logits.device
    lp = torch.empty(B, dtype=torch.float32, device=dev)
    tv = torch.empty((B, k), dtype=torch.float32, device=dev)
    ti = torch.empty((B, k), dtype=torch.int64, device=dev)
    if B == 0 or V == 0:
        return lp, tv[:, :n], ti[:, :n]
    NB = triton.cdiv(V, BLOCK)
    cv = torch.empty((B, NB * k), dtype=torch.float32, device=dev)
    ci = torch.empty((B, NB * k), dtype=torch.int32, device=dev)
    pm = torch.empty((B, NB), dtype=torch.float32, device=dev)
    ps = torch.empty((B, NB), dtype=torch.float32, device=dev)
    block_topk_kernel[(B, NB)](logits, cv, ci, pm, ps, V, logits.stride(0), NB, K=k, BLOCK=BLOCK, LSE=True)
    nc_pow, nb_pow = max(2, triton.next_power_of_2(NB * k)), max(2, triton.next_power_of_2(NB))
    _row_kernel[(B,)](logits, ids.contiguous(), cv, ci, pm, ps, lp, tv, ti, V, logits.stride(0), NB, NB * k, K=k,
                      NC_POW=nc_pow, NB_POW=nb_pow)  # fmt: skip
    return lp, tv[:, :n], ti[:, :n]
