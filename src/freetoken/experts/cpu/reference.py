"""Torch reference of the CPU expert kernel: the test oracle and the fallback without a compiler.

Shapes: T tokens, D hidden, I intermediate, R routes, N pool rows. Computes in float32 whatever the
bank dtype (weights are upcast per expert), so it is exact up to float32 summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# the activations by the kernel's index, defined with the experts' torch reference
from freetoken.experts.reference import ACTIVATIONS, GPTOSS_ALPHA, GPTOSS_LIMIT, activate
from freetoken.quant import FP8_BLOCK_128, MXFP4, NVFP4, WeightFormat

__all__ = ["ACTIVATIONS", "GPTOSS_ALPHA", "GPTOSS_LIMIT", "activate", "cpu_experts_reference"]


def cpu_experts_reference(
    x: torch.Tensor,  # [T, D] float32
    tok: torch.Tensor,  # [R] token of each route
    row: torch.Tensor,  # [R] pool row (eid) of each route
    weight: torch.Tensor,  # [R] gate weight of each route
    gate_up: torch.Tensor,  # [N, 2I, D]
    down: torch.Tensor,  # [N, D, I]
    activation: str = "silu",
    out: torch.Tensor | None = None,  # [T, D] float32, overwritten
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,  # packed banks: their scale banks
    gate_up_bias: torch.Tensor | None = None,  # [N, 2I]: added to gate_up @ x before the activation (gpt-oss)
) -> torch.Tensor:
    """``out[t] = sum over routes s of t: weight[s] * down[row[s]] @ act(gate_up[row[s]] @ x[t])``; packed banks
    dequantised per expert by the format's reference (``quant/``: ``bank_format`` says which)."""
    T, D = x.shape
    inter = gate_up.shape[1] // 2
    if out is None:
        out = torch.empty((T, D), dtype=torch.float32)
    out.zero_()
    if row.numel() == 0:
        return out
    tok = tok.long()
    rows, inverse = torch.unique(row, return_inverse=True)
    for j, r in enumerate(rows.tolist()):
        sel = (inverse == j).nonzero().squeeze(1)
        xs = x[tok[sel]].float()
        gu, dn = _expert(gate_up, down, scales, r)
        gate = F.linear(xs, gu[:inter])  # [n, I]
        up = F.linear(xs, gu[inter:])
        if gate_up_bias is not None:
            gate, up = gate + gate_up_bias[r, :inter].float(), up + gate_up_bias[r, inter:].float()
        h = activate(gate, up, activation)
        y = F.linear(h, dn)  # [n, D]
        out.index_add_(0, tok[sel], y * weight[sel].float()[:, None])
    return out


def bank_format(gate_up: torch.Tensor, scales: tuple[torch.Tensor, torch.Tensor] | None) -> WeightFormat | None:
    """The packed format of banks as the kernel takes them (None: float banks): fp8 blocks by dtype; the FP4
    formats (both uint8) by their scale rows' width: D/32 bytes (MXFP4) or D/16 + 4 (NVFP4)."""
    if gate_up.dtype == torch.float8_e4m3fn:
        return FP8_BLOCK_128
    if gate_up.dtype != torch.uint8:
        return None
    D = 2 * gate_up.shape[-1]
    if scales is None or scales[0].dim() != 3:
        raise ValueError("uint8 (FP4) banks need their scale banks")
    width = scales[0].shape[-1]
    if width == MXFP4.scale_shape(1, D)[1]:
        return MXFP4
    if width == NVFP4.scale_shape(1, D)[1]:
        return NVFP4
    raise ValueError(f"uint8 banks with scale rows of {width} bytes for D={D}: neither mxfp4 nor nvfp4")


def _expert(
    gate_up: torch.Tensor, down: torch.Tensor, scales: tuple[torch.Tensor, torch.Tensor] | None, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``r``'s (gate_up, down) in float32."""
    fmt = bank_format(gate_up, scales)
    if fmt is None or scales is None:
        return gate_up[r].float(), down[r].float()
    return fmt.dequantize(gate_up[r], scales[0][r], torch.float32), fmt.dequantize(down[r], scales[1][r], torch.float32)
