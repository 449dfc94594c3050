"""Unquantised float weights: bf16 in production, fp16/fp32 in tests. No scales; "dequantising" is a dtype cast."""

from __future__ import annotations

import torch

from freetoken.quant.base import WeightFormat


class Bf16Format(WeightFormat):
    name = "bf16"
    quantized = False

    def packed_cols(self, cols: int) -> int:
        return cols

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        return ()

    def scale_name(self, weight_name: str) -> str:
        return ""

    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        return packed.to(dtype)

    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return w, None


BF16 = Bf16Format()
