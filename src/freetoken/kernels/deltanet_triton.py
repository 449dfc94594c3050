"""A gated DeltaNet layer's decode step in one Triton launch, for CUDA: between the in_proj GEMM and the gated
RMSNorm (``norm_triton.gated_rms_norm_triton``), everything ``gated_delta.deltanet_step_reference`` does.

One program per (sequence b, value head h, block of BV value columns), from the in_proj output row: the causal conv
step over the slot's last K-1 inputs and this token (float32 sums rounded once, SiLU, as ``causal_conv``), the new
window written into the conv pool in place; ``g = -exp(A_log) softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` in
float32; q/k L2-normalised (eps 1e-6 inside the square root, as ``l2norm``), q scaled by dk^-0.5, value head h
reading key head h // (H/Hk); the gated delta rule on the slot's [dk, BV] float32 state tile, in place in the pool;
the output core[b, h, block]. A sequence at position 0 reads zeros for both states (masked loads, no branch).

Who writes which conv channels: a v channel is read by its one program, which writes it. The q/k channels of key
head hk are read by the H/Hk * NV programs of its value heads and blocks; the last of them to arrive writes them
(an arrival counter per (slot, key head), back to 0 after each launch), so none reads a window already shifted.
A row whose slot an earlier row holds writes nothing; its reads may see the state that row already advanced,
so callers never pass one (the step graph has a graph per batch size for models with state slots, no pad rows).
Shapes: B rows, S pool slots, C conv channels (2*Hk*dk + H*dv), K conv width.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_window(row, win, Wc, c, mc, keep, KW: tl.constexpr, KP: tl.constexpr):
    """Channels ``c`` ([N], mask ``mc``): the SiLU-ed conv output [N] float32 and the window [N, KP] (the K-1 inputs
    before, zeros at position 0, then this token's input in column K-1)."""
    j = tl.arange(0, KP)[None, :]
    cc, m = c[:, None], mc[:, None]
    prev = tl.load(win + cc * (KW - 1) + j, mask=m & (j < KW - 1) & keep, other=0.0)
    x = tl.load(row + c, mask=mc, other=0.0)
    window = tl.where(j == KW - 1, x[:, None].to(prev.dtype), prev)
    w = tl.load(Wc + cc * KW + j, mask=m & (j < KW), other=0.0)
    acc = tl.sum(window.to(tl.float32) * w.to(tl.float32), axis=1).to(x.dtype).to(tl.float32)
    return (acc / (1.0 + tl.exp(-acc))).to(x.dtype).to(tl.float32), window


@triton.jit
def _store_window(win, c, mc, window, write, KW: tl.constexpr, KP: tl.constexpr):
    """The new window of channels ``c``: columns 1..K-1 of ``window`` into the slot's K-1 places."""
    j = tl.arange(0, KP)[None, :]
    mask = mc[:, None] & (j >= 1) & (j < KW) & write
    tl.store(win + c[:, None] * (KW - 1) + j - 1, window.to(win.dtype.element_ty), mask=mask)


@triton.jit
def _deltanet_step_kernel(
    Mixed, Bg, Ag, stride_x, Conv, Ssm, Wc, Alog, Dtb, Slots, Pos, Arrive, Core, scale,
    H: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KW: tl.constexpr,
    KP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, BB: tl.constexpr,
):  # fmt: skip
    i, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(Slots + i).to(tl.int64)
    keep = tl.load(Pos + i) > 0
    rows = tl.arange(0, BB)
    earlier = tl.load(Slots + rows, mask=rows < i, other=-1)
    own = tl.sum((earlier == slot).to(tl.int32), axis=0) == 0  # no earlier row holds this slot (else: a pad)
    hk = h // (H // HK)
    C = 2 * HK * DK + H * DV
    row, win = Mixed + i * stride_x, Conv + slot * (C * (KW - 1))
    ok = tl.arange(0, BK)
    mk = ok < DK
    ov = vb * BV + tl.arange(0, BV)
    mv = ov < DV
    cq, ck, cv = hk * DK + ok, HK * DK + hk * DK + ok, 2 * HK * DK + h * DV + ov
    q, q_win = _conv_window(row, win, Wc, cq, mk, keep, KW, KP)
    k, k_win = _conv_window(row, win, Wc, ck, mk, keep, KW, KP)
    v, v_win = _conv_window(row, win, Wc, cv, mv, keep, KW, KP)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    b = tl.load(Bg + i * stride_x + h).to(tl.float32)
    a = tl.load(Ag + i * stride_x + h).to(tl.float32) + tl.load(Dtb + h).to(tl.float32)
    beta = 1.0 / (1.0 + tl.exp(-b))
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))  # torch's threshold 20
    g = -tl.exp(tl.load(Alog + h).to(tl.float32)) * softplus

    state = Ssm + (slot * H + h) * (DK * DV) + ok[:, None] * DV + ov[None, :]  # [BK, BV] of the slot's [dk, dv]
    m2 = mk[:, None] & mv[None, :]
    s = tl.load(state, mask=m2 & keep, other=0.0)  # this program's own tile: loaded before the wait below
    _store_window(win, cv, mv, v_win, own, KW, KP)
    # the q/k windows: every reader has read them (the barrier, then the counter's acquire-release) before the last
    # one writes them
    tl.debug_barrier()
    counter = Arrive + slot * HK + hk
    ticket = tl.atomic_add(counter, 1, mask=own, sem="acq_rel")
    last = own & (ticket == (H // HK) * NV - 1)
    _store_window(win, cq, mk, q_win, last, KW, KP)
    _store_window(win, ck, mk, k_win, last, KW, KP)
    tl.store(counter, 0, mask=last)
    s = s * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta  # [BV]
    s = s + k[:, None] * delta[None, :]
    tl.store(state, s, mask=m2 & own)
    out = tl.sum(s * q[:, None], axis=0)
    tl.store(Core + (i * H + h) * DV + ov, out.to(Core.dtype.element_ty), mask=mv)


@functools.cache
def _arrivals(device: torch.device, n: int) -> torch.Tensor:
    """The arrival counters for a pool of n/Hk slots (zeros between launches; one buffer for every layer, whose
    launches run one after another)."""
    return torch.zeros(n, dtype=torch.int32, device=device)


def deltanet_step_triton(
    mixed: torch.Tensor,  # [B, C] the in_proj output's conv channels (a view: column stride 1)
    b: torch.Tensor,  # [B, H] its beta logits (a view of the same rows)
    a: torch.Tensor,  # [B, H] its decay logits
    conv_pool: torch.Tensor,  # [S, C, K-1] one layer's conv windows, written in place
    ssm_pool: torch.Tensor,  # [S, H, dk, dv] float32, written in place
    slots: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B]
    conv_w: torch.Tensor,  # [C, K]
    A_log: torch.Tensor,  # [H]
    dt_bias: torch.Tensor,  # [H]
    k_heads: int,
    k_dim: int,
    out_dtype: torch.dtype = torch.float32,
    block_v: int | None = None,
) -> torch.Tensor:  # [B, H, dv] the core output
    B, C = mixed.shape
    S, H, dk, dv = ssm_pool.shape
    K = conv_w.shape[1]
    if dk != k_dim or C != 2 * k_heads * dk + H * dv or H % k_heads or conv_pool.shape != (S, C, K - 1):
        raise ValueError(f"deltanet_step: conv channels {C}, pools {tuple(conv_pool.shape)} / {tuple(ssm_pool.shape)}"
                         f" do not fit {k_heads} key heads of {k_dim}")  # fmt: skip
    if ssm_pool.dtype != torch.float32 or not (conv_pool.is_contiguous() and ssm_pool.is_contiguous()):
        raise ValueError("deltanet_step: the pools must be contiguous, the recurrent state float32")
    if not (mixed.stride(1) == b.stride(1) == a.stride(1) == 1 and mixed.stride(0) == b.stride(0) == a.stride(0)):
        raise ValueError("deltanet_step: mixed, b and a must be column views of the same rows")
    BV = block_v or min(triton.next_power_of_2(dv), 32)
    NV = triton.cdiv(dv, BV)
    core = torch.empty((B, H, dv), dtype=out_dtype, device=mixed.device)
    if B == 0:
        return core
    _deltanet_step_kernel[(B, H, NV)](
        mixed, b, a, mixed.stride(0), conv_pool, ssm_pool, conv_w.contiguous(), A_log, dt_bias, slots, positions,
        _arrivals(mixed.device, S * k_heads), core, dk**-0.5,
        H=H, HK=k_heads, DK=dk, DV=dv, KW=K, KP=triton.next_power_of_2(K), BK=triton.next_power_of_2(dk),
        BV=BV, NV=NV, BB=triton.next_power_of_2(B),
    )  # fmt: skip
    return core
