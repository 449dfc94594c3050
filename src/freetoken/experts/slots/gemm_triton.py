"""Triton grouped expert GEMM over slots (routes sorted by eid, hence by slot).

Two kernels, grid (group, N-tile); groups g >= n_groups or with slot -1 return at once, so the grid
is fixed per step size and nothing is read back by the host:
1. ``h[p] = silu(x[tok_p] @ Wg[s].T) * (x[tok_p] @ Wu[s].T)`` for the routes p of group g ([K, I] fp32,
   in sorted order); gpt-oss's experts (``act``): the gate/up biases of the group's eid added, then its clamped
   activation;
2. ``y[route_p] = w_p * (h[p] @ Wd[s].T)`` written at the route's original index ([K, D] fp32);
3. ``out[t] = sum_j y[t*k + j]`` over the routes served here (slot >= 0), cast to the output dtype (deterministic:
   no atomics on the sums): at decode sizes (``COMBINE_IN_DOWN_MAX`` routes) in the down launch itself, by the last
   of each N-tile's programs to finish (a ticket per tile, reset by that program); above, in a launch of its own
   (``combine_routes``). The rows of routes served elsewhere are never written, so nothing needs zeroing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from freetoken.experts.reference import ACTIVATIONS, ExpertAct
from freetoken.experts.slots.plan import RouteGroups
from freetoken.experts.slots.plan_triton import group_in_registers, group_tables, store_groups
from freetoken.kernels.triton_support import tickets

BM, _BN, _BK = 16, 64, 64
BM_BIG, BIG_STEP = 64, 1024  # token tile for steps of more than BIG_STEP routes


@dataclass(frozen=True)
class GemmTiles:
    """Weight-row tile (BN) and reduction tile (BK) of each kernel, and warps per program."""

    gu_bn: int = _BN
    gu_bk: int = _BK
    dn_bn: int = _BN
    dn_bk: int = _BK
    gu_warps: int = 4
    dn_warps: int = 4


DEFAULT_TILES = GemmTiles()
# One token's experts: narrower gate_up tiles with a longer reduction step keep more programs streaming
# (``bench/gpu/gemm_tiles.py`` compares tiles; measured faster at T = 1 only, docs/benchmarks.md).
ONE_TOKEN_TILES = GemmTiles(gu_bn=32, gu_bk=128)


def decode_tiles(routes: int) -> GemmTiles:
    """The tiles for a step of ``routes`` routes (top-k of one token, or more)."""
    return ONE_TOKEN_TILES if routes <= 8 else DEFAULT_TILES


@triton.jit(do_not_specialize=["K", "layer_off", "n_rows"])
def _gate_up_kernel(
    x,
    gu,
    h,
    order,
    gstart,
    gcount,
    gslot,
    ngroups_ptr,
    ids,
    K,
    layer_off,
    n_rows,
    tables,
    valid_out,
    geid,
    bias,
    D: tl.constexpr,
    I: tl.constexpr,
    TOPK: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
    GROUP: tl.constexpr,  # group the K routes ``ids`` here (every program, in registers; slot = eid), no tables read
    KB: tl.constexpr,
    HAS_BIAS: tl.constexpr = False,  # gate/up biases by eid ``bias`` [N, 2I] float32 (gpt-oss)
    ACT: tl.constexpr = 0,  # ``ACTIVATIONS``' index: 0 SiLU, 1 gpt-oss's, 2 Gemma-4's GELU(tanh), 3 DeepSeek-V4's
):
    g = tl.program_id(0)
    nt = tl.program_id(1)
    if GROUP:
        r = tl.arange(0, KB)
        rv = r < K
        n64 = n_rows.to(tl.int64)
        e = tl.where(rv, tl.load(ids + r, mask=rv, other=0).to(tl.int64) + layer_off, n64)
        order_v, g_of, gstart_v, gcount_v, geid, gvalid, n_groups = group_in_registers(e, r, rv, K, n64)
        if (g == 0) & (nt == 0):  # the tables for the down launch (and the caller)
            store_groups(tables, valid_out, K, r, rv, e, order_v, g_of, gstart_v, gcount_v, geid, gvalid, n_groups)
        mine = r == g
        s = tl.sum(tl.where(mine, geid, 0), axis=0)
        live = g < n_groups
        start = tl.sum(tl.where(mine, gstart_v, 0), axis=0)
        cnt = tl.sum(tl.where(mine, gcount_v, 0), axis=0)
    else:
        s = tl.load(gslot + g)
        live = (g < tl.load(ngroups_ptr)) & (s >= 0)
        start = tl.load(gstart + g)
        cnt = tl.load(gcount + g)
    if live:
        wbase = gu + s.to(tl.int64) * (2 * I * D)
        offs_n = nt * BN + tl.arange(0, BN)
        nmask = offs_n < I
        for m0 in range(0, cnt, BM):
            rows = m0 + tl.arange(0, BM)
            mmask = rows < cnt
            if GROUP:  # order[start + rows] from the registers
                hit = (start + rows)[:, None] == r[None, :]
                ridx = tl.sum(tl.where(hit, order_v[None, :], 0), axis=1)
            else:
                ridx = tl.load(order + start + rows, mask=mmask, other=0)
            tok = (ridx // TOPK).to(tl.int64)
            acc_g = tl.zeros((BM, BN), dtype=tl.float32)
            acc_u = tl.zeros((BM, BN), dtype=tl.float32)
            for d0 in range(0, D, BK):
                offs_k = d0 + tl.arange(0, BK)
                kmask = offs_k < D
                xmask = mmask[:, None] & kmask[None, :]
                xa = tl.load(x + tok[:, None] * D + offs_k[None, :], mask=xmask, other=0.0)
                wmask = kmask[:, None] & nmask[None, :]
                wg = tl.load(wbase + offs_n[None, :] * D + offs_k[:, None], mask=wmask, other=0.0)
                wu = tl.load(wbase + (I + offs_n)[None, :] * D + offs_k[:, None], mask=wmask, other=0.0)
                acc_g = tl.dot(xa, wg, acc_g, input_precision=PREC)
                acc_u = tl.dot(xa, wu, acc_u, input_precision=PREC)
            if HAS_BIAS:
                eid = s if GROUP else tl.load(geid + g)
                brow = bias + eid.to(tl.int64) * (2 * I)
                acc_g += tl.load(brow + offs_n, mask=nmask, other=0.0)[None, :]
                acc_u += tl.load(brow + I + offs_n, mask=nmask, other=0.0)[None, :]
            hv = gated_activation(acc_g, acc_u, ACT)
            hp = h + (start + rows).to(tl.int64)[:, None] * I + offs_n[None, :]
            tl.store(hp, hv, mask=mmask[:, None] & nmask[None, :])


@triton.jit
def gated_activation(g, u, ACT: tl.constexpr):
    """By ``ACTIVATIONS``' index: SiLU-gated (0); gpt-oss's (1): gate clamped above at 7, up to [-7, 7],
    ``(u + 1) * g * sigmoid(1.702 g)``; Gemma-4's (2) ``gelu_tanh(g) * u`` (tanh(z) = 2 sigmoid(2z) - 1); DeepSeek-V4's
    (3): SiLU-gated with the gate clamped above at 10 and up to [-10, 10]."""
    if ACT == 2:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * z))) * u
    if ACT == 3:
        g = tl.minimum(g, 10.0)
        u = tl.minimum(tl.maximum(u, -10.0), 10.0)
    if ACT == 1:
        g = tl.minimum(g, 7.0)
        u = tl.minimum(tl.maximum(u, -7.0), 7.0)
        return (u + 1.0) * (g / (1.0 + tl.exp(-1.702 * g)))
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def _down_kernel(
    h,
    dn,
    y,
    wts,
    order,
    gstart,
    gcount,
    gslot,
    ngroups_ptr,
    out,
    route_group,
    tickets,
    T,
    D: tl.constexpr,
    I: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
    TOPK: tl.constexpr,
    COMBINE: tl.constexpr,  # the last program of each N-tile sums its columns of y into out (decode sizes)
    BT: tl.constexpr,
    BKP: tl.constexpr,
):
    g = tl.program_id(0)
    nt = tl.program_id(1)
    s = tl.load(gslot + g)
    if (g < tl.load(ngroups_ptr)) & (s >= 0):
        start = tl.load(gstart + g)
        cnt = tl.load(gcount + g)
        wbase = dn + s.to(tl.int64) * (D * I)
        offs_n = nt * BN + tl.arange(0, BN)
        nmask = offs_n < D
        for m0 in range(0, cnt, BM):
            rows = m0 + tl.arange(0, BM)
            mmask = rows < cnt
            ridx = tl.load(order + start + rows, mask=mmask, other=0).to(tl.int64)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for i0 in range(0, I, BK):
                offs_k = i0 + tl.arange(0, BK)
                kmask = offs_k < I
                hp = h + (start + rows).to(tl.int64)[:, None] * I + offs_k[None, :]
                wd = tl.load(
                    wbase + offs_n[None, :] * I + offs_k[:, None],
                    mask=kmask[:, None] & nmask[None, :],
                    other=0.0,
                )
                ha = tl.load(hp, mask=mmask[:, None] & kmask[None, :], other=0.0).to(wd.dtype)
                acc = tl.dot(ha, wd, acc, input_precision=PREC)
            w = tl.load(wts + ridx, mask=mmask, other=0.0)
            yp = y + ridx[:, None] * D + offs_n[None, :]
            tl.store(yp, acc * w[:, None], mask=mmask[:, None] & nmask[None, :])
    if COMBINE:
        tl.debug_barrier()  # every thread's rows of y stored before the ticket releases them
        tk = tickets + nt
        if tl.atomic_add(tk, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            _combine_tile(y, out, route_group, gslot, ngroups_ptr, T, nt, D, TOPK, BN, BT, BKP)
            tl.store(tk, 0)  # ready for the next launch


@triton.jit
def _combine_tile(y, out, route_group, gslot, ngroups_ptr, T, nt, D: tl.constexpr, TOPK: tl.constexpr,
                  BN: tl.constexpr, BT: tl.constexpr, BKP: tl.constexpr):  # fmt: skip
    """Columns nt*BN.. of ``out[t] = sum_j y[t*k + j]`` over the served routes, every token at once (y read from L2:
    other programs wrote it)."""
    t = tl.arange(0, BT)[:, None, None]
    j = tl.arange(0, BKP)[None, :, None]
    cols = nt * BN + tl.arange(0, BN)[None, None, :]
    r = (t * TOPK + j).to(tl.int64)
    on = (t < T) & (j < TOPK)
    grp = tl.load(route_group + r, mask=on, other=0)
    ng = tl.load(ngroups_ptr)
    served = on & (grp < ng) & (tl.load(gslot + grp, mask=on & (grp < ng), other=-1) >= 0)
    ys = tl.load(y + r * D + cols, mask=served & (cols < D), other=0.0, cache_modifier=".cg")
    tsum = tl.sum(ys, axis=1)  # [BT, BN]
    t2 = tl.arange(0, BT)[:, None]
    c2 = nt * BN + tl.arange(0, BN)[None, :]
    tl.store(out + t2.to(tl.int64) * D + c2, tsum.to(out.dtype.element_ty), mask=(t2 < T) & (c2 < D))


@triton.jit
def _combine_kernel(
    y, out, route_group, gslot, ngroups_ptr,
    D: tl.constexpr, TOPK: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    cmask = cols < D
    ng = tl.load(ngroups_ptr)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        r = t * TOPK + j
        g = tl.load(route_group + r)
        served = (g < ng) & (tl.load(gslot + g, mask=g < ng, other=-1) >= 0)
        acc += tl.load(y + r * D + cols, mask=cmask & served, other=0.0)
    tl.store(out + t * D + cols, acc.to(out.dtype.element_ty), mask=cmask)


_COMBINE_BN = 256


def combine_routes(
    y: torch.Tensor,  # [T*k, D] float32, rows of routes served elsewhere unwritten
    groups: RouteGroups,
    slot: torch.Tensor,  # [K] per group, -1 = not here
    T: int,
    k: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [T, D]
    """``y.view(T, k, D).sum(1)`` over the served routes only, in ``out_dtype``, in one launch."""
    D = y.shape[1]
    out = torch.empty((T, D), dtype=out_dtype, device=y.device)
    if T:
        grid = (T, triton.cdiv(D, _COMBINE_BN))
        _combine_kernel[grid](y, out, groups.route_group, slot, groups.n_groups.reshape(1), D=D, TOPK=k, BN=_COMBINE_BN)
    return out


def grouped_experts_triton(
    x: torch.Tensor,  # [T, D] compute dtype
    groups: RouteGroups,
    slot: torch.Tensor,  # [K] per group, -1 = not here
    topk_w: torch.Tensor,  # [T, k]
    slot_gate_up: torch.Tensor,  # [S+1, 2I, D]
    slot_down: torch.Tensor,  # [S+1, D, I]
    max_groups: int | None = None,  # distinct experts a step can route to (a layer's E): bounds the grid
    tiles: GemmTiles | None = None,  # None: decode_tiles(K) (``bench/gpu/gemm_tiles.py`` compares settings)
    out_dtype: torch.dtype = torch.float32,
    act: ExpertAct | None = None,  # gpt-oss's biased clamped activation (None: SiLU)
) -> torch.Tensor:  # [T, D] out_dtype
    return _run(x, groups, slot, topk_w, slot_gate_up, slot_down, max_groups, tiles, out_dtype, None, act)


def grouped_experts_routed_triton(
    x: torch.Tensor,  # [T, D]
    topk_ids: torch.Tensor,  # [T, k] a layer's expert ids (T*k <= plan_triton.MAX_ROUTES)
    layer_offset: int,  # the layer's first row of the banks
    topk_w: torch.Tensor,
    gate_up: torch.Tensor,  # [N, 2I, D] every expert resident: slot = eid
    down: torch.Tensor,
    max_groups: int | None = None,
    out_dtype: torch.dtype = torch.float32,
    act: ExpertAct | None = None,
) -> torch.Tensor:
    """``grouped_experts_triton(x, group_routes_triton(topk_ids, layer_offset, N), eids, ...)`` in two launches: the
    gate_up kernel's programs group the routes themselves (one of them writes the tables the down kernel reads)."""
    ids = topk_ids.reshape(-1)
    i64, b, groups = group_tables(ids.numel(), ids.device)
    grouping = (ids, layer_offset, int(gate_up.shape[0]), i64, b)
    return _run(x, groups, groups.eid, topk_w, gate_up, down, max_groups, None, out_dtype, grouping, act)


def _run(
    x: torch.Tensor, groups: RouteGroups, slot: torch.Tensor, topk_w: torch.Tensor, slot_gate_up: torch.Tensor,
    slot_down: torch.Tensor, max_groups: int | None, tiles: GemmTiles | None, out_dtype: torch.dtype,
    grouping: tuple[torch.Tensor, int, int, torch.Tensor, torch.Tensor] | None, act: ExpertAct | None = None,
) -> torch.Tensor:  # fmt: skip
    T, k = topk_w.shape
    K = T * k
    G = K if max_groups is None else min(K, max_groups)  # groups g >= n_groups exit at once
    bm = BM if K <= BIG_STEP else BM_BIG  # long prefill steps: many tokens per expert
    D = x.shape[1]
    I = slot_down.shape[2]
    x = x.to(slot_gate_up.dtype).contiguous()
    h = torch.empty((K, I), dtype=torch.float32, device=x.device)
    y = torch.empty((K, D), dtype=torch.float32, device=x.device)  # rows of unserved routes: never read
    wts = topk_w.reshape(-1).float().contiguous()
    ng = groups.n_groups.reshape(1)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32: exact products, no TF32 rounding
    routes = (groups.order, groups.start, groups.count, slot, ng)  # both kernels walk the same groups
    t = tiles or decode_tiles(K)
    gu = {"D": D, "I": I, "BM": bm, "BN": t.gu_bn, "BK": t.gu_bk, "PREC": prec, "num_warps": t.gu_warps}
    dn = {"D": D, "I": I, "BM": bm, "BN": t.dn_bn, "BK": t.dn_bk, "PREC": prec, "num_warps": t.dn_warps}
    ids, off, n_rows, i64, b = grouping or (groups.order, 0, 0, groups.order, groups.order)  # unused without GROUP
    kb = max(16, triton.next_power_of_2(K)) if grouping is not None else 1
    grp = (ids, K, off, n_rows, i64, b)
    bias = act.gate_up_bias if act is not None and act.gate_up_bias is not None else None
    act_index = ACTIVATIONS.index(act.name) if act is not None else 0
    _gate_up_kernel[(G, triton.cdiv(I, t.gu_bn))](x, slot_gate_up, h, *routes, *grp, groups.eid,
                                                  h if bias is None else bias, TOPK=k, GROUP=grouping is not None,
                                                  KB=kb, HAS_BIAS=bias is not None, ACT=act_index, **gu)  # fmt: skip
    n_tiles = triton.cdiv(D, t.dn_bn)
    one_launch = K <= COMBINE_IN_DOWN_MAX
    out = torch.empty((T, D), dtype=out_dtype, device=x.device) if one_launch else y
    fold = {"TOPK": k, "COMBINE": one_launch, "BT": triton.next_power_of_2(T) if one_launch else 1,
            "BKP": triton.next_power_of_2(k) if one_launch else 1}  # fmt: skip
    tail = (out, groups.route_group, tickets(x.device, n_tiles, "grouped_down"), T)
    _down_kernel[(G, n_tiles)](h, slot_down, y, wts, *routes, *tail, **fold, **dn)
    return out if one_launch else combine_routes(y, groups, slot, T, k, out_dtype)


# Steps of up to this many routes (decode) sum the routes in the down launch; larger ones in a launch of their own.
COMBINE_IN_DOWN_MAX = 64
