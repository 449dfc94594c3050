"""RMSNorm (and residual add + RMSNorm, and embedding lookup + RMSNorm) in one Triton launch per call, for CUDA.

The torch version (``norm.py``) is ~7 elementwise and reduction kernels per norm, and a decode step runs
four norms per layer: in a CUDA graph the launches are cheap, but each kernel still costs the GPU a few
microseconds. Same arithmetic as the reference: float32 statistics, the normalised row rounded to the
compute dtype, then multiplied by the weight in the compute dtype; the residual sum rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    X, D, W, H, Y, N, eps, stride, HAS_ADD: tl.constexpr, BLOCK: tl.constexpr, GATHER: tl.constexpr = False,
    ROUNDING: tl.constexpr = 0,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if GATHER:  # X = the embedding table, D = the token ids: h = X[D[row]] stored to H
        x = tl.load(X + tl.load(D + row).to(tl.int64) * stride + cols, mask=mask, other=0.0)
        tl.store(H + row * stride + cols, x, mask=mask)
    else:
        x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    if HAS_ADD:
        x = x + tl.load(D + row * stride + cols, mask=mask, other=0.0)  # in the compute dtype, as h + delta
        tl.store(H + row * stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    if ROUNDING == 0:  # the normalised row rounded to x's dtype, times the weight (norm.py)
        normed = (xf * inv).to(x.dtype)
        w = tl.load(W + cols, mask=mask, other=0.0)
        y = (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)
    elif ROUNDING == 1:  # DeepSeek-V4's: a float32 weight times the float32 normalised row, rounded once
        y = (tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) * (xf * inv)).to(x.dtype)
    else:  # DeepSeek-V4's unweighted: x times the factor rounded to x's dtype
        y = x * inv.to(x.dtype)
    tl.store(Y + row * stride + cols, y, mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    y, _ = _launch(x, None, weight, eps)
    return y


def add_rms_norm_triton(
    h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h + delta, rms_norm(h + delta)) in one pass."""
    y, s = _launch(h, delta, weight, eps)
    assert s is not None
    return s, y


def embed_rms_norm_triton(
    ids: torch.Tensor, embed: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed[ids], rms_norm(embed[ids])) in one pass."""
    N = embed.shape[1]
    if weight.numel() != N or embed.stride(1) != 1:
        raise ValueError(f"embed rms_norm: weight of {weight.numel()} for rows of {N}")
    T = ids.numel()
    h = torch.empty((T, N), dtype=embed.dtype, device=embed.device)
    y = torch.empty_like(h)
    if T:
        _rms_norm_kernel[(T,)](
            embed, ids.reshape(-1), weight.to(embed.dtype).contiguous(), h, y, N, eps, embed.stride(0),
            HAS_ADD=False, BLOCK=triton.next_power_of_2(N), GATHER=True,
        )  # fmt: skip
    return h, y


def v4_rms_norm_triton(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """DeepSeek-V4's RMSNorm over x's last dim (``layers/hyper_connections.v4_rms_norm``: a float32 weight multiplied
    in float32, rounded once) or, without a weight, its ``unweighted_rms`` (the factor rounded to x's dtype first)."""
    N = x.shape[-1]
    if weight is not None and weight.numel() != N:
        raise ValueError(f"rms_norm: weight of {weight.numel()} for rows of {N}")
    x2 = x.reshape(-1, N).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0]:
        w = x2 if weight is None else weight.float().contiguous()  # unread without a weight
        _rms_norm_kernel[(x2.shape[0],)](
            x2, x2, w, y, y, N, eps, N, HAS_ADD=False, BLOCK=triton.next_power_of_2(N),
            ROUNDING=2 if weight is None else 1,
        )  # fmt: skip
    return y.view(x.shape)


def _launch(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    N = x.shape[-1]
    if weight.numel() != N:
        raise ValueError(f"rms_norm: weight of {weight.numel()} for rows of {N}")
    x2 = x.reshape(-1, N).contiguous()
    d2 = delta.reshape(-1, N).to(x.dtype).contiguous() if delta is not None else x2
    y = torch.empty_like(x2)
    s = torch.empty_like(x2) if delta is not None else y
    _rms_norm_kernel[(x2.shape[0],)](
        x2, d2, weight.to(x.dtype).contiguous(), s, y, N, eps, N,
        HAS_ADD=delta is not None, BLOCK=triton.next_power_of_2(N),
    )  # fmt: skip
    return y.view(x.shape), (s.view(x.shape) if delta is not None else None)


@triton.jit
def _gated_rms_norm_kernel(X, Z, W, Y, N, eps, sx_t, sx_h, sz_t, sz_h, HEADS, BLOCK: tl.constexpr):
    t, h = tl.program_id(0) // HEADS, tl.program_id(0) % HEADS
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    z = tl.load(Z + t * sz_t + h * sz_h + cols, mask=mask, other=0.0)
    x = tl.load(X + t * sx_t + h * sx_h + cols, mask=mask, other=0.0).to(z.dtype).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0)
    normed = (w.to(tl.float32) * (x * inv).to(z.dtype).to(tl.float32)).to(z.dtype).to(tl.float32)
    zf = z.to(tl.float32)
    tl.store(Y + (t * HEADS + h) * N + cols, (normed * zf / (1.0 + tl.exp(-zf))).to(z.dtype), mask=mask)


def gated_rms_norm_triton(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, z [T, H, n] (any row and head strides, columns contiguous) -> [T, H, n] contiguous in z's dtype:
    ``rms_norm(x in z's dtype, weight) * silu(z)`` rounded as ``norm.gated_rms_norm_reference``. One program per
    (token, head)."""
    T, H, N = z.shape
    if x.shape != z.shape or weight.numel() != N or x.stride(2) != 1 or z.stride(2) != 1:
        raise ValueError(f"gated_rms_norm: x {tuple(x.shape)}, z {tuple(z.shape)}, weight of {weight.numel()}")
    y = torch.empty((T, H, N), dtype=z.dtype, device=z.device)
    if T * H:
        _gated_rms_norm_kernel[(T * H,)](
            x, z, weight.to(z.dtype).contiguous(), y, N, eps, x.stride(0), x.stride(1), z.stride(0), z.stride(1), H,
            BLOCK=triton.next_power_of_2(N),
        )  # fmt: skip
    return y
