"""The slot banks a grouped expert GEMM reads (``gemm.py`` and its Triton kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.experts.base import dequantize_rows
from freetoken.experts.reference import ExpertAct
from freetoken.quant import BF16, WeightFormat


@dataclass(frozen=True)
class SlotWeights:
    """The slot banks a grouped GEMM reads: weights in ``fmt`` and, for a quantised one, their scales."""

    gate_up: torch.Tensor  # [S+1, 2I, D']
    down: torch.Tensor  # [S+1, D, I']
    fmt: WeightFormat = BF16
    gate_up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None
    act: ExpertAct | None = None  # gpt-oss's biased clamped activation (None: SiLU); its rows are eids, not slots

    def rows(self, s: torch.Tensor | int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up, down) of slots ``s`` in ``dtype`` (a view, unquantised in ``dtype`` already)."""
        if not self.fmt.quantized and self.gate_up.dtype == dtype:
            return self.gate_up[s], self.down[s]
        return dequantize_rows(self.fmt, self.gate_up, self.gate_up_scale, self.down, self.down_scale, s, dtype)
