"""Triton grouped expert GEMM over slots holding fp8 e4m3 weights with 128x128 block scales (``quant/fp8_block.py``),
dequantised in registers: the same two kernels, grid and route layout as ``gemm_triton.py`` (which says how), but
weights load as bytes, widen to the compute dtype and each (BN x BK) tile's dot product is scaled once.

Widening: a byte sign-extended to 16 bits and shifted left by 7, with bit 14 cleared, is the fp16 encoding of the
e4m3 value / 256, exactly (subnormals too; fp16's exponent bias is 8 above e4m3's). Integer ops and an fp16 bitcast
only, so the kernel builds for every GPU Triton targets (no fp8 type, which sm_86 lacks); the tile's scale carries
the factor 256. A tile lies in one scale block: BN and BK divide 128 and tiles start at multiples of themselves.
e4m3 values / 256 are exact in bf16 and fp16, so the only roundings are the dot's and the scaling's (the torch
reference rounds the dequantised weights to the compute dtype first: it is the less exact of the two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.experts.slots.gemm_triton import BIG_STEP, BM, BM_BIG, GemmTiles, combine_routes, decode_tiles
from freetoken.experts.slots.plan import RouteGroups
from freetoken.experts.slots.weights import SlotWeights

BLOCK = 128  # rows and columns per scale
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@triton.jit
def _widen(b, DT: tl.constexpr):
    """uint8 e4m3 codes -> the values / 256 in the compute dtype (DT: 0 fp32, 1 bf16, 2 fp16)."""
    h = b.to(tl.int8, bitcast=True).to(tl.int32)
    h = ((h << 7) & 0xBFFF).to(tl.int16)
    return _as_dt(h.to(tl.float16, bitcast=True), DT)


@triton.jit
def _as_dt(v, DT: tl.constexpr):
    if DT == 0:
        out = v.to(tl.float32)
    elif DT == 1:
        out = v.to(tl.bfloat16)
    else:
        out = v.to(tl.float16)
    return out


@triton.jit
def _gate_up_fp8_kernel(
    x, gu, gus, h, order, gstart, gcount, gslot, ngroups_ptr,
    D: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0)
    nt = tl.program_id(1)
    s = tl.load(gslot + g)
    if (g < tl.load(ngroups_ptr)) & (s >= 0):
        start = tl.load(gstart + g)
        cnt = tl.load(gcount + g)
        wbase = gu + s.to(tl.int64) * (2 * I * D)
        SD: tl.constexpr = D // 128
        sbase = gus + s.to(tl.int64) * ((2 * I // 128) * SD)
        g_srow = sbase + ((nt * BN) // 128) * SD  # this tile's block row of gate, then of up
        u_srow = sbase + ((I + nt * BN) // 128) * SD
        offs_n = nt * BN + tl.arange(0, BN)
        nmask = offs_n < I
        for m0 in range(0, cnt, BM):
            rows = m0 + tl.arange(0, BM)
            mmask = rows < cnt
            ridx = tl.load(order + start + rows, mask=mmask, other=0)
            tok = (ridx // TOPK).to(tl.int64)
            acc_g = tl.zeros((BM, BN), dtype=tl.float32)
            acc_u = tl.zeros((BM, BN), dtype=tl.float32)
            for d0 in range(0, D, BK):
                offs_k = d0 + tl.arange(0, BK)
                kmask = offs_k < D
                xa = tl.load(x + tok[:, None] * D + offs_k[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
                wmask = kmask[:, None] & nmask[None, :]
                wg = _widen(tl.load(wbase + offs_n[None, :] * D + offs_k[:, None], mask=wmask, other=0), DT)
                wu = _widen(tl.load(wbase + (I + offs_n)[None, :] * D + offs_k[:, None], mask=wmask, other=0), DT)
                sg = tl.load(g_srow + d0 // 128) * 256.0
                su = tl.load(u_srow + d0 // 128) * 256.0
                acc_g += tl.dot(xa, wg, input_precision=PREC) * sg
                acc_u += tl.dot(xa, wu, input_precision=PREC) * su
            hv = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
            hp = h + (start + rows).to(tl.int64)[:, None] * I + offs_n[None, :]
            tl.store(hp, hv, mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _down_fp8_kernel(
    h, dn, dns, y, wts, order, gstart, gcount, gslot, ngroups_ptr,
    D: tl.constexpr, I: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0)
    nt = tl.program_id(1)
    s = tl.load(gslot + g)
    if (g < tl.load(ngroups_ptr)) & (s >= 0):
        start = tl.load(gstart + g)
        cnt = tl.load(gcount + g)
        wbase = dn + s.to(tl.int64) * (D * I)
        SI: tl.constexpr = I // 128
        srow = dns + s.to(tl.int64) * ((D // 128) * SI) + ((nt * BN) // 128) * SI
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
                wd = _widen(tl.load(wbase + offs_n[None, :] * I + offs_k[:, None], mask=kmask[:, None] & nmask[None, :],
                                    other=0), DT)  # fmt: skip
                hp = h + (start + rows).to(tl.int64)[:, None] * I + offs_k[None, :]
                ha = _as_dt(tl.load(hp, mask=mmask[:, None] & kmask[None, :], other=0.0), DT)
                acc += tl.dot(ha, wd, input_precision=PREC) * (tl.load(srow + i0 // 128) * 256.0)
            w = tl.load(wts + ridx, mask=mmask, other=0.0)
            yp = y + ridx[:, None] * D + offs_n[None, :]
            tl.store(yp, acc * w[:, None], mask=mmask[:, None] & nmask[None, :])


def grouped_experts_fp8_triton(
    x: torch.Tensor,  # [T, D] compute dtype
    groups: RouteGroups,
    slot: torch.Tensor,  # [K] per group, -1 = not here
    topk_w: torch.Tensor,  # [T, k]
    weights: SlotWeights,  # fp8 e4m3 slots [S+1, 2I, D], [S+1, D, I] with their fp32 block scales
    max_groups: int | None = None,  # distinct experts a step can route to (a layer's E): bounds the grid
    tiles: GemmTiles | None = None,  # None: decode_tiles(K)
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # [T, D] out_dtype
    T, k = topk_w.shape
    K = T * k
    G = K if max_groups is None else min(K, max_groups)
    bm = BM if K <= BIG_STEP else BM_BIG
    D = x.shape[1]
    I = weights.down.shape[2]
    t = tiles or decode_tiles(K)
    for n in (t.gu_bn, t.gu_bk, t.dn_bn, t.dn_bk):
        assert BLOCK % n == 0, f"fp8 tiles must divide the {BLOCK}-block, got {n}"
    assert weights.gate_up_scale is not None and weights.down_scale is not None and D % BLOCK == 0 and I % BLOCK == 0
    dt = _DTYPES[x.dtype]
    x = x.contiguous()
    h = torch.empty((K, I), dtype=torch.float32, device=x.device)
    y = torch.empty((K, D), dtype=torch.float32, device=x.device)  # rows of unserved routes: never read
    wts = topk_w.reshape(-1).float().contiguous()
    ng = groups.n_groups.reshape(1)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    routes = (groups.order, groups.start, groups.count, slot, ng)
    gu_raw, dn_raw = weights.gate_up.view(torch.uint8), weights.down.view(torch.uint8)  # no fp8 type reaches Triton
    gu = {"D": D, "I": I, "BM": bm, "BN": t.gu_bn, "BK": t.gu_bk, "DT": dt, "PREC": prec, "num_warps": t.gu_warps}
    dn = {"D": D, "I": I, "BM": bm, "BN": t.dn_bn, "BK": t.dn_bk, "DT": dt, "PREC": prec, "num_warps": t.dn_warps}
    _gate_up_fp8_kernel[(G, triton.cdiv(I, t.gu_bn))](x, gu_raw, weights.gate_up_scale, h, *routes, TOPK=k, **gu)
    _down_fp8_kernel[(G, triton.cdiv(D, t.dn_bn))](h, dn_raw, weights.down_scale, y, wts, *routes, **dn)
    return combine_routes(y, groups, slot, T, k, out_dtype)
