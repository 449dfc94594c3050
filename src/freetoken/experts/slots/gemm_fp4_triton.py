"""Triton grouped expert GEMM over slots holding FP4 weights (MXFP4 or NVFP4, ``quant/mxfp4.py``,
``quant/nvfp4.py``), dequantised in registers: the grid and route layout of ``gemm_triton.py`` (which says how),
but each reduction step of BK codes loads a [BK/2, BN] tile of packed bytes (contiguous runs of each weight row, which
Triton vectorises and pipelines) and the scale-row bytes, decodes both nibbles of every byte and the group scales
with integer ops and bitcasts only (no fp8 or fp4 type reaches Triton: e2m1 and e4m3 bits moved into an fp16, exact,
then widened), multiplies them in float32 as the torch
reference does (``e2m1 * scale``; NVFP4 ``scale = e4m3 * the row's multiplier``), rounds once to the compute dtype
and runs two dots: the even codes (low nibbles) against the operand's even columns, the odd codes against its odd
ones. (Indexing codes one by one, ``k // 2``, hid the bytes' contiguity from Triton: byte loads, 5.3 + 4.9 ms of a
13.2 ms gpt-oss-20b step on the H100 box, 2026-12-07.) Exact against the reference's dequantised weights; only
summation order differs. gpt-oss's experts (``SlotWeights.act``) add the gate/up biases of the group's eid to the
float32 accumulators, then take the clamped activation, as ``gemm_triton.py`` does for bf16 slots (the same
``gated_activation``).

Hopper (the GPU box) has no FP4 tensor cores, so this path dequantises; ``grouped_experts_fp4`` is the dispatch
point where a Blackwell path (native e2m1 operands with block scales) would plug in, taking the same slots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.experts.reference import ACTIVATIONS, ExpertAct
from freetoken.experts.slots.gemm_triton import (
    BIG_STEP,
    BM,
    BM_BIG,
    GemmTiles,
    combine_routes,
    decode_tiles,
    gated_activation,
)
from freetoken.experts.slots.plan import RouteGroups
from freetoken.experts.slots.weights import SlotWeights

COLS = 32  # D and I are multiples of this; reduction tiles too
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_KINDS = {"mxfp4": 0, "nvfp4": 1}
# One token's NVFP4 gate/up: a reduction step of 256 codes (16 groups' scales a load) beside the bf16 kernel's 128
# (bench/gpu/fp4_gemm.py's sweep, H100, 2026-12-07: Qwen3's shape 36.1 against 43.6 µs, gpt-oss's 83.3 against 85.5;
# MXFP4 ran slower with it: 34.6 against 33.8, 94.8 against 85.6)
NV_ONE_TOKEN_TILES = GemmTiles(gu_bn=32, gu_bk=256)


def fp4_decode_tiles(routes: int, kind: str) -> GemmTiles:
    """The FP4 kernels' tiles for a step of ``routes`` routes of ``kind`` ("mxfp4" or "nvfp4") experts."""
    return NV_ONE_TOKEN_TILES if kind == "nvfp4" and routes <= 8 else decode_tiles(routes)


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
def _bits_f32(u):
    return u.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _f16_bits_f32(u):
    """int32 holding fp16 bits in its low 16 -> that fp16 value as float32 (exact, subnormals included)."""
    return u.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3(c):
    """e4m3 bytes ``c`` (int32, 0..255) -> float32 values, exactly (0x7F / 0xFF, NaN, read as 480): its bits moved up
    by 7 (the sign to bit 15) are the fp16 of its value / 256, subnormals included."""
    return _f16_bits_f32(((c & 0x7F) << 7) | ((c & 0x80) << 8)) * 256.0


@triton.jit
def _e2m1_lo(b):
    """The low nibbles of bytes ``b`` (int32) as e2m1 values, float32, exactly. Sign to bit 15 and the 3 magnitude bits
    to bits 9-11 make the fp16 whose value is the e2m1 value x 2^-14 (e = 0, m = 1 its subnormal 2^-15); the product
    with 2^14 is exact."""
    return _f16_bits_f32(((b & 7) << 9) | ((b & 8) << 12)) * 16384.0


@triton.jit
def _e2m1_hi(b):
    """The high nibbles of bytes ``b`` (int32, 0..255) as e2m1 values, float32, exactly (``_e2m1_lo``'s bits)."""
    return _f16_bits_f32(((b & 0x70) << 5) | ((b & 0x80) << 8)) * 16384.0


@triton.jit
def _w_tiles(wp, sp, rows, b0, rmask, NB: tl.constexpr, K: tl.constexpr, KIND: tl.constexpr, DT: tl.constexpr):
    """The weight tiles of ``rows`` x the NB packed bytes from ``b0`` (a multiple of 16) of one slot bank (``wp``
    packed bytes [rows, K/2], ``sp`` scale rows) in the compute dtype: [NB, BN] of the even codes 2b (each byte's low
    nibble) and of the odd codes 2b + 1 (its high nibble). The bytes load as contiguous runs of each row, both nibbles
    used; the group scales load once per group ([NB/16, BN] for MXFP4, [NB/8, BN] for NVFP4) and are broadcast over
    their bytes."""
    offs_b = b0 + tl.arange(0, NB)
    m = (offs_b < K // 2)[:, None] & rmask[None, :]
    r = rows[None, :].to(tl.int64)
    b = tl.load(wp + r * (K // 2) + offs_b[:, None], mask=m, other=0).to(tl.int32)
    BN: tl.constexpr = rows.shape[0]
    if KIND == 0:  # MXFP4: e8m0 per 32 codes (16 bytes) -> 2^(s - 127) (code 0: 2^-127, a subnormal)
        gi = b0 // 16 + tl.arange(0, NB // 16)
        gm = (gi < K // 32)[:, None] & rmask[None, :]
        s = tl.load(sp + r * (K // 32) + gi[:, None], mask=gm, other=127).to(tl.int32)
        sg = _bits_f32(tl.where(s == 0, 0x00400000, s << 23))
        scale = tl.reshape(tl.broadcast_to(sg[:, None, :], (NB // 16, 16, BN)), (NB, BN))
    else:  # NVFP4: e4m3 per 16 codes (8 bytes), times the row's float32 multiplier (the scale row's last 4 bytes)
        SB: tl.constexpr = K // 16 + 4
        gi = b0 // 8 + tl.arange(0, NB // 8)
        gm = (gi < K // 16)[:, None] & rmask[None, :]
        c = tl.load(sp + r * SB + gi[:, None], mask=gm, other=0).to(tl.int32)
        mb = sp + rows.to(tl.int64) * SB + K // 16
        u = (tl.load(mb, mask=rmask, other=0).to(tl.int32) | (tl.load(mb + 1, mask=rmask, other=0).to(tl.int32) << 8)
             | (tl.load(mb + 2, mask=rmask, other=0).to(tl.int32) << 16)
             | (tl.load(mb + 3, mask=rmask, other=0).to(tl.int32) << 24))  # fmt: skip
        sg = _e4m3(c) * _bits_f32(u)[None, :]
        scale = tl.reshape(tl.broadcast_to(sg[:, None, :], (NB // 8, 8, BN)), (NB, BN))
    return _as_dt(_e2m1_lo(b) * scale, DT), _as_dt(_e2m1_hi(b) * scale, DT)


@triton.jit
def _gate_up_fp4_kernel(
    x, gu, gus, h, order, gstart, gcount, gslot, ngroups_ptr, geid, bias,
    D: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, KIND: tl.constexpr, SROW: tl.constexpr,
    HAS_BIAS: tl.constexpr = False,  # gate/up biases by eid ``bias`` [N, 2I] float32 (gpt-oss)
    ACT: tl.constexpr = 0,  # ``ACTIVATIONS``' index: 0 SiLU, 1 gpt-oss's, 2 Gemma-4's GELU(tanh), 3 DeepSeek-V4's
):  # fmt: skip
    g = tl.program_id(0)
    nt = tl.program_id(1)
    s = tl.load(gslot + g)
    if (g < tl.load(ngroups_ptr)) & (s >= 0):
        start = tl.load(gstart + g)
        cnt = tl.load(gcount + g)
        wp = gu + s.to(tl.int64) * (2 * I * (D // 2))
        sp = gus + s.to(tl.int64) * (2 * I * SROW)
        offs_n = nt * BN + tl.arange(0, BN)
        nmask = offs_n < I
        for m0 in range(0, cnt, BM):
            rows = m0 + tl.arange(0, BM)
            mmask = rows < cnt
            ridx = tl.load(order + start + rows, mask=mmask, other=0)
            tok = (ridx // TOPK).to(tl.int64)
            acc_g = tl.zeros((BM, BN), dtype=tl.float32)
            acc_u = tl.zeros((BM, BN), dtype=tl.float32)
            for b0 in range(0, D // 2, BK // 2):  # BK codes = BK / 2 packed bytes a step
                offs_k = 2 * b0 + tl.arange(0, BK)
                xm = mmask[:, None] & (offs_k < D)[None, :]
                xa = tl.load(x + tok[:, None] * D + offs_k[None, :], mask=xm, other=0.0)
                xe, xo = tl.split(tl.reshape(xa, (BM, BK // 2, 2)))  # x at the even codes, and at the odd ones
                ge, go = _w_tiles(wp, sp, offs_n, b0, nmask, BK // 2, D, KIND, DT)
                ue, uo = _w_tiles(wp, sp, I + offs_n, b0, nmask, BK // 2, D, KIND, DT)
                acc_g = tl.dot(xe, ge, acc_g, input_precision=PREC)
                acc_g = tl.dot(xo, go, acc_g, input_precision=PREC)
                acc_u = tl.dot(xe, ue, acc_u, input_precision=PREC)
                acc_u = tl.dot(xo, uo, acc_u, input_precision=PREC)
            if HAS_BIAS:
                brow = bias + tl.load(geid + g).to(tl.int64) * (2 * I)
                acc_g += tl.load(brow + offs_n, mask=nmask, other=0.0)[None, :]
                acc_u += tl.load(brow + I + offs_n, mask=nmask, other=0.0)[None, :]
            hv = gated_activation(acc_g, acc_u, ACT)
            hp = h + (start + rows).to(tl.int64)[:, None] * I + offs_n[None, :]
            tl.store(hp, hv, mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _down_fp4_kernel(
    h, dn, dns, y, wts, order, gstart, gcount, gslot, ngroups_ptr,
    D: tl.constexpr, I: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr,
    PREC: tl.constexpr, KIND: tl.constexpr, SROW: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0)
    nt = tl.program_id(1)
    s = tl.load(gslot + g)
    if (g < tl.load(ngroups_ptr)) & (s >= 0):
        start = tl.load(gstart + g)
        cnt = tl.load(gcount + g)
        wp = dn + s.to(tl.int64) * (D * (I // 2))
        sp = dns + s.to(tl.int64) * (D * SROW)
        offs_n = nt * BN + tl.arange(0, BN)
        nmask = offs_n < D
        for m0 in range(0, cnt, BM):
            rows = m0 + tl.arange(0, BM)
            mmask = rows < cnt
            ridx = tl.load(order + start + rows, mask=mmask, other=0).to(tl.int64)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for b0 in range(0, I // 2, BK // 2):
                we, wo = _w_tiles(wp, sp, offs_n, b0, nmask, BK // 2, I, KIND, DT)
                offs_k = 2 * b0 + tl.arange(0, BK)
                hm = mmask[:, None] & (offs_k < I)[None, :]
                hp = h + (start + rows).to(tl.int64)[:, None] * I + offs_k[None, :]
                ha = _as_dt(tl.load(hp, mask=hm, other=0.0), DT)
                he, ho = tl.split(tl.reshape(ha, (BM, BK // 2, 2)))
                acc = tl.dot(he, we, acc, input_precision=PREC)
                acc = tl.dot(ho, wo, acc, input_precision=PREC)
            w = tl.load(wts + ridx, mask=mmask, other=0.0)
            yp = y + ridx[:, None] * D + offs_n[None, :]
            tl.store(yp, acc * w[:, None], mask=mmask[:, None] & nmask[None, :])


def grouped_experts_fp4(
    x: torch.Tensor,
    groups: RouteGroups,
    slot: torch.Tensor,
    topk_w: torch.Tensor,
    weights: SlotWeights,
    max_groups: int | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The FP4 dispatch point: the dequantising Triton kernels (every GPU Triton targets), gpt-oss's biases and
    activation included (``weights.act``). A Blackwell path (FP4 tensor cores) would be chosen here by device
    capability; none is built."""
    return grouped_experts_fp4_triton(x, groups, slot, topk_w, weights, max_groups, out_dtype=out_dtype)


def grouped_experts_fp4_triton(
    x: torch.Tensor,  # [T, D] compute dtype
    groups: RouteGroups,
    slot: torch.Tensor,  # [K] per group, -1 = not here
    topk_w: torch.Tensor,  # [T, k]
    weights: SlotWeights,  # uint8 slots [S+1, 2I, D/2], [S+1, D, I/2] with their uint8 scale rows
    max_groups: int | None = None,  # distinct experts a step can route to (a layer's E): bounds the grid
    tiles: GemmTiles | None = None,  # None: fp4_decode_tiles(K, format)
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # [T, D] out_dtype
    T, k = topk_w.shape
    K = T * k
    G = K if max_groups is None else min(K, max_groups)
    bm = BM if K <= BIG_STEP else BM_BIG
    D = x.shape[1]
    I = weights.gate_up.shape[1] // 2
    kind = _KINDS[weights.fmt.name]
    t = tiles or fp4_decode_tiles(K, weights.fmt.name)
    assert t.gu_bk % COLS == 0 and t.dn_bk % COLS == 0, f"fp4 reduction tiles must be multiples of {COLS}"
    assert weights.gate_up_scale is not None and weights.down_scale is not None and D % COLS == 0 and I % COLS == 0
    srow_gu, srow_dn = weights.gate_up_scale.shape[-1], weights.down_scale.shape[-1]
    act: ExpertAct | None = weights.act  # biases by eid (``groups.eid``), not by slot
    bias = act.gate_up_bias if act is not None and act.gate_up_bias is not None else None
    act_index = 0 if act is None else ACTIVATIONS.index(act.name) if act.name in ACTIVATIONS else -1
    if act is not None and act_index < 0:
        raise ValueError(f"the FP4 grouped GEMM has no {act.name!r} activation")
    dt = _DTYPES[x.dtype]
    x = x.contiguous()
    h = torch.empty((K, I), dtype=torch.float32, device=x.device)
    y = torch.empty((K, D), dtype=torch.float32, device=x.device)  # rows of unserved routes: never read
    wts = topk_w.reshape(-1).float().contiguous()
    ng = groups.n_groups.reshape(1)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    routes = (groups.order, groups.start, groups.count, slot, ng)
    common = {"D": D, "I": I, "BM": bm, "DT": dt, "PREC": prec, "KIND": kind}
    gu = {**common, "BN": t.gu_bn, "BK": t.gu_bk, "SROW": srow_gu, "num_warps": t.gu_warps}
    dn = {**common, "BN": t.dn_bn, "BK": t.dn_bk, "SROW": srow_dn, "num_warps": t.dn_warps}
    _gate_up_fp4_kernel[(G, triton.cdiv(I, t.gu_bn))](x, weights.gate_up, weights.gate_up_scale, h, *routes,
                                                      groups.eid, h if bias is None else bias, TOPK=k,
                                                      HAS_BIAS=bias is not None, ACT=act_index, **gu)  # fmt: skip
    _down_fp4_kernel[(G, triton.cdiv(D, t.dn_bn))](h, weights.down, weights.down_scale, y, wts, *routes, **dn)
    return combine_routes(y, groups, slot, T, k, out_dtype)
