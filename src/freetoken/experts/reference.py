"""Torch reference for routed experts: the oracle every expert kernel is tested against, and the experts' gated
activation as every torch path applies it (``ExpertAct``: SiLU, or gpt-oss's clamped one after its gate/up biases)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "gptoss", "gelu_tanh", "dsv4")  # in the C++ kernel's order (``experts/cpu/kernel_api.h``)
GPTOSS_LIMIT = 7.0
GPTOSS_ALPHA = 1.702
DSV4_LIMIT = 10.0  # DeepSeek-V4's ``swiglu_limit``: SiLU with the gate clamped above, up clamped both ways


def activate(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """``silu(gate) * up``, gpt-oss's clamped gated activation, ``gelu_tanh(gate) * up`` (Gemma-4), or DeepSeek-V4's
    clamped SiLU."""
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gptoss":
        gate = gate.clamp(max=GPTOSS_LIMIT)
        up = up.clamp(min=-GPTOSS_LIMIT, max=GPTOSS_LIMIT)
        return (up + 1.0) * (gate * torch.sigmoid(GPTOSS_ALPHA * gate))
    if activation == "gelu_tanh":  # Gemma-4: gelu_pytorch_tanh(gate) * up
        return F.gelu(gate, approximate="tanh") * up
    if activation == "dsv4":
        return F.silu(gate.clamp(max=DSV4_LIMIT)) * up.clamp(min=-DSV4_LIMIT, max=DSV4_LIMIT)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


@dataclass(frozen=True)
class ExpertAct:
    """How ``gate_up @ x`` becomes the expert's hidden ``h``: biases of the pool row added (gpt-oss), then the
    activation (``cpu/reference.py`` ``ACTIVATIONS``). Rows are eids, so slots need no copy of the biases."""

    name: str = "silu"
    gate_up_bias: torch.Tensor | None = None  # [N, 2I] float32 on the compute device (gate half, then up half)

    @classmethod
    def of(cls, name: str, gate_up_bias: torch.Tensor | None, device: torch.device) -> ExpertAct | None:
        """None for plain SiLU without biases (the paths' own fast form)."""
        if name == "silu" and gate_up_bias is None:
            return None
        bias = None if gate_up_bias is None else gate_up_bias.to(device=device, dtype=torch.float32)
        return cls(name, bias)

    def apply(self, gu: torch.Tensor, rows: torch.Tensor | int) -> torch.Tensor:
        """gu [n, 2I] of pool rows ``rows`` ([n] or one row) -> h [n, I] in gu's dtype."""
        if self.gate_up_bias is not None:
            gu = gu + self.gate_up_bias[rows].to(gu.dtype)
        gate, up = gu.chunk(2, dim=-1)
        return activate(gate, up, self.name)


def expert_ffn(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: ExpertAct | None = None, row: int = 0
) -> torch.Tensor:
    """One gated expert (pool row ``row``: its biases under ``act``). x [T, D], gate_up [2I, D], down [D, I] -> [T, D]
    (weights of another dtype, such as a CPU's bf16 banks under float32 steps, are widened to x's first)."""
    gu = F.linear(x, gate_up.to(x.dtype))
    if act is not None:
        return F.linear(act.apply(gu, row), down.to(x.dtype))
    gate, up = gu.chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down.to(x.dtype))


def moe_reference(
    x: torch.Tensor,  # [T, D]
    topk_ids: torch.Tensor,  # [T, k] pool rows (eid) or per-layer ids offset by the caller
    topk_w: torch.Tensor,  # [T, k]
    gate_up: torch.Tensor,  # [N, 2I, D]
    down: torch.Tensor,  # [N, D, I]
    act: ExpertAct | None = None,  # its rows are topk_ids' rows
) -> torch.Tensor:
    """Loop over the distinct experts (sort by expert); accumulates in float32."""
    T, D = x.shape
    out = torch.zeros((T, D), dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    flat_tok = torch.arange(T, device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_w = topk_w.reshape(-1).to(torch.float32)
    order = torch.argsort(flat_ids, stable=True)
    ids_sorted = flat_ids[order]
    uniq, counts = torch.unique_consecutive(ids_sorted, return_counts=True)
    start = 0
    for e, c in zip(uniq.tolist(), counts.tolist()):
        sel = order[start : start + c]
        start += c
        tok = flat_tok[sel]
        y = expert_ffn(x[tok], gate_up[e], down[e], act, e).to(torch.float32)
        out.index_add_(0, tok, y * flat_w[sel, None])
    return out.to(x.dtype)
