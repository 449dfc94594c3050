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
    # [2I + n, D]: gate's rows, up's, then n rows a caller reads beside them (a shared expert's sigmoid gate), one
    # GEMM for all (``fuse_inputs``); gate and up are views of it
    inputs: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_extra(x)[0]

    def forward_with_extra(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The MLP's output [T, D] and x's products with the extra rows of ``inputs`` [T, n] (None without)."""
        if self.inputs is not None:
            I = self.gate.shape[0]
            gu = linear(x, self.inputs)
            gate, up, extra = gu[:, :I], gu[:, I : 2 * I], gu[:, 2 * I :]
        else:
            gate, up, extra = linear(x, self.gate, self.gate_bias), linear(x, self.up, self.up_bias), None
        g = F.gelu(gate, approximate="tanh") if self.act == "gelu_tanh" else F.silu(gate)
        return linear(g * up, self.down, self.down_bias), extra


def fuse_inputs(mlp: DenseMLP, extra: torch.Tensor | None = None) -> tuple[DenseMLP, torch.Tensor | None]:
    """``mlp`` reading its gate, up and ``extra`` rows [n, D] in one GEMM (a decode step's GEMV launches are a fixed
    cost each: the shared expert's gate, up and sigmoid gate were three, and cuBLAS's dot for the last two kernels);
    returns the MLP and ``extra`` as views of the one weight. Unchanged where biases or dtypes differ."""
    if mlp.inputs is not None or mlp.gate_bias is not None or mlp.up_bias is not None:
        return mlp, extra
    rows = [mlp.gate, mlp.up] + ([extra] if extra is not None else [])
    if len({(t.dtype, t.device, t.shape[1]) for t in rows}) != 1:
        return mlp, extra
    I, cat = mlp.gate.shape[0], torch.cat(rows)
    fused = DenseMLP(cat[:I], cat[I : 2 * I], mlp.down, down_bias=mlp.down_bias, act=mlp.act, inputs=cat)
    return fused, (cat[2 * I :] if extra is not None else None)
