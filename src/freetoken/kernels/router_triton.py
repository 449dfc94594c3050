"""The router's softmax, top-k and renormalisation in one Triton launch per MoE layer (CUDA).

In torch the same is ~6 kernels per layer (softmax, topk, sum, divide, two casts). Per token's row of E router
logits: float32 softmax, k rounds of "largest, lowest index on ties", the weights divided by their sum when the
model renormalises, then rounded to the activation dtype (as the reference casts the routing weights before use)
and returned in float32. ``route_triton``: a program per token, on given logits. ``route_linear_triton`` (decode
sizes): the router's GEMM in the same launch — program (i, s) computes the partial logits of experts i*BE.. over
its share s of the hidden dim for every token, and the last program to finish (a ticket) sums the shares in order,
rounds the logits to the activation dtype (as ``F.linear`` returns them) and routes every token at once (over the T
rows only, not the GEMM tile's 16: the tail runs alone, after every other program).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.triton_support import tickets

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _route_kernel(
    L, IDS, W, E, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr,
    ACT: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    emask = e < E
    logit = tl.load(L + t * E + e, mask=emask, other=float("-inf")).to(tl.float32)
    p = tl.exp(logit - tl.max(logit, 0))
    p = tl.where(emask, p, 0.0)
    p = p / tl.sum(p, 0)
    p = tl.where(emask, p, -1.0)
    kk = tl.arange(0, BLOCK_K)
    ids = tl.zeros((BLOCK_K,), tl.int64)
    ws = tl.zeros((BLOCK_K,), tl.float32)
    for j in tl.static_range(K):
        top = tl.max(p, 0)
        idx = tl.min(tl.where(p == top, e, BLOCK_E), 0)
        ids = tl.where(kk == j, idx.to(tl.int64), ids)
        ws = tl.where(kk == j, top, ws)
        p = tl.where(e == idx, -1.0, p)
    if NORM:
        ws = ws / tl.sum(tl.where(kk < K, ws, 0.0), 0)
    ws = ws.to(ACT).to(tl.float32)
    kmask = kk < K
    tl.store(IDS + t * K + kk, ids, mask=kmask)
    tl.store(W + t * K + kk, ws, mask=kmask)


def route_triton(
    logits: torch.Tensor, top_k: int, norm_topk: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (ids [T, k] int64, weights [T, k] float32 holding ``dtype``-rounded values)."""
    T, E = logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"route: top-{top_k} of {E} experts")
    logits = logits.contiguous()
    ids = torch.empty((T, top_k), dtype=torch.int64, device=logits.device)
    w = torch.empty((T, top_k), dtype=torch.float32, device=logits.device)
    if T:
        _route_kernel[(T,)](
            logits, ids, w, E, K=top_k, BLOCK_E=triton.next_power_of_2(E),
            BLOCK_K=max(2, triton.next_power_of_2(top_k)), NORM=norm_topk, ACT=_TL[dtype],
        )  # fmt: skip
    return ids, w


@triton.jit
def _linear_route_kernel(
    X, RW, L, IDS, W, TK, T, E, D,
    K: tl.constexpr, BT: tl.constexpr, BE: tl.constexpr, BD: tl.constexpr, KS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, NORM: tl.constexpr, ACT: tl.constexpr, PREC: tl.constexpr, BTT: tl.constexpr,
):  # fmt: skip
    e0 = tl.program_id(0) * BE
    ks = tl.program_id(1)  # this program's share of the reduction (split-K: more programs stream the weights)
    t = tl.arange(0, BT)
    tmask = t < T
    ev = e0 + tl.arange(0, BE)
    emask = ev < E
    chunk = tl.cdiv(tl.cdiv(D, KS), BD) * BD
    acc = tl.zeros((BT, BE), tl.float32)
    for d0 in range(ks * chunk, tl.minimum(ks * chunk + chunk, D), BD):
        dd = d0 + tl.arange(0, BD)
        dmask = dd < D
        x = tl.load(X + t[:, None].to(tl.int64) * D + dd[None, :], mask=tmask[:, None] & dmask[None, :], other=0.0)
        w = tl.load(RW + ev[None, :].to(tl.int64) * D + dd[:, None], mask=dmask[:, None] & emask[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PREC)
    tl.store(L + (ks * BT + t[:, None]) * E + ev[None, :], acc, mask=tmask[:, None] & emask[None, :])
    tl.debug_barrier()  # every thread's partial logits stored before the ticket releases them
    if tl.atomic_add(TK, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) * KS - 1:
        # the routing of the T tokens only (BTT = T rounded up to a power of two; the GEMM's tile has 16 rows)
        tr = tl.arange(0, BTT)
        trm = tr < T
        e = tl.arange(0, BLOCK_E)
        am = trm[:, None] & (e[None, :] < E)
        logit = tl.zeros((BTT, BLOCK_E), tl.float32)
        for j in tl.static_range(KS):  # the partials in a fixed order, then rounded as F.linear's output
            logit += tl.load(L + (j * BT + tr[:, None]) * E + e[None, :], mask=am, other=0.0, cache_modifier=".cg")
        logit = tl.where(am, logit.to(ACT).to(tl.float32), float("-inf"))
        logit = tl.where(trm[:, None], logit, 0.0)  # padding rows: finite, never stored
        p = tl.exp(logit - tl.max(logit, 1)[:, None])
        p = tl.where(am, p, 0.0)
        p = p / tl.where(trm, tl.sum(p, 1), 1.0)[:, None]
        p = tl.where(am, p, -1.0)
        kk = tl.arange(0, BLOCK_K)
        ids = tl.zeros((BTT, BLOCK_K), tl.int64)
        ws = tl.zeros((BTT, BLOCK_K), tl.float32)
        for j in tl.static_range(K):
            top = tl.max(p, 1)
            idx = tl.min(tl.where(p == top[:, None], e[None, :], BLOCK_E), 1)
            ids = tl.where(kk[None, :] == j, idx[:, None].to(tl.int64), ids)
            ws = tl.where(kk[None, :] == j, top[:, None], ws)
            p = tl.where(e[None, :] == idx[:, None], -1.0, p)
        if NORM:
            ws = ws / tl.sum(tl.where(kk[None, :] < K, ws, 0.0), 1)[:, None]
        ws = ws.to(ACT).to(tl.float32)
        om = trm[:, None] & (kk[None, :] < K)
        tl.store(IDS + tr[:, None] * K + kk[None, :], ids, mask=om)
        tl.store(W + tr[:, None] * K + kk[None, :], ws, mask=om)
        tl.store(TK, 0)  # ready for the next launch


ONE_LAUNCH_TOKENS = 16  # route_linear_triton's steps: decode batches
_BE, _BD, _KS = 16, 128, 4  # E=128, D=2048: 32 programs of 16 KiB of weights


def route_linear_triton(
    x: torch.Tensor, router: torch.Tensor, top_k: int, norm_topk: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] (T <= ONE_LAUNCH_TOKENS), router [E, D] -> ``route_triton(F.linear(x, router), ...)`` in one launch."""
    T, D = x.shape
    E = router.shape[0]
    if not 0 < T <= ONE_LAUNCH_TOKENS or router.shape[1] != D:
        raise ValueError(f"route: {T} tokens of {D} (1..{ONE_LAUNCH_TOKENS}) for a router of {tuple(router.shape)}")
    if not 0 < top_k <= E:
        raise ValueError(f"route: top-{top_k} of {E} experts")
    x, router = x.contiguous(), router.to(x.dtype).contiguous()
    ks = max(1, min(_KS, triton.cdiv(D, _BD)))
    partial = torch.empty((ks, 16, E), dtype=torch.float32, device=x.device)  # [split, token, expert]
    ids = torch.empty((T, top_k), dtype=torch.int64, device=x.device)
    w = torch.empty((T, top_k), dtype=torch.float32, device=x.device)
    _linear_route_kernel[(triton.cdiv(E, _BE), ks)](
        x, router, partial, ids, w, tickets(x.device, 1, "route"), T, E, D,
        K=top_k, BT=16, BE=_BE, BD=_BD, KS=ks, BLOCK_E=triton.next_power_of_2(E),
        BLOCK_K=max(2, triton.next_power_of_2(top_k)), NORM=norm_topk, ACT=_TL[x.dtype],
        PREC="ieee" if x.dtype == torch.float32 else "tf32", BTT=max(2, triton.next_power_of_2(T)),
    )  # fmt: skip
    return ids, w
