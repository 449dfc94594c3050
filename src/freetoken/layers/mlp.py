"""Dense SiLU-gated MLP (dense layers and shared experts)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.layers import cpu_step


@dataclass
class DenseMLP:
    gate: torch.Tensor  # [I, D]
    up: torch.Tensor  # [I, D]
    down: torch.Tensor  # [D, I]
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    def __post_init__(self) -> None:  # float32 CPU decode steps on a bf16 checkpoint read bf16 copies
        self.gate16, self.up16, self.down16 = (cpu_step.bf16_copy(w) for w in (self.gate, self.up, self.down))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = cpu_step.linear(x, self.gate, self.gate16, self.gate_bias)
        h = F.silu(gate) * cpu_step.linear(x, self.up, self.up16, self.up_bias)
        return cpu_step.linear(h, self.down, self.down16, self.down_bias)
