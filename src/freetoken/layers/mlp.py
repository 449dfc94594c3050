"""Dense gated MLP (dense layers and shared experts): SiLU-gated, or GELU(tanh)-gated (Gemma-4)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.kernels.linear import linear


@dataclass
class DenseMLP:
    gate: torch.Tensor  # [I, D]
    up: torch.Tensor  # [I, D]
    down: torch.Tensor  # [D, I]
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None
    act: str = "silu"  # "silu" | "gelu_tanh" (Gemma-4's gelu_pytorch_tanh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = linear(x, self.gate, self.gate_bias)
        g = F.gelu(gate, approximate="tanh") if self.act == "gelu_tanh" else F.silu(gate)
        h = g * linear(x, self.up, self.up_bias)
        return linear(h, self.down, self.down_bias)
