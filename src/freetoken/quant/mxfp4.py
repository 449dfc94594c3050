"""MXFP4 (OCP Microscaling): e2m1 elements (``quant/e2m1.py``), two a byte, with one e8m0 scale per 32 elements
along the reduction dimension: ``w = e2m1 * 2^(scale - 127)``.

Bank layout: packed ``[rows, cols / 2]`` uint8 and scales ``[rows, cols / 32]`` uint8 (the e8m0 bytes; code 255,
NaN in the spec, is not produced by quantisers and dequantises as 2^128). Checkpoint layouts read:

- gpt-oss (``quant_method: mxfp4``): ``<name>_blocks`` ``[..., rows, cols / 32, 16]`` uint8 beside
  ``<name>_scales`` ``[..., rows, cols / 32]`` uint8 (transformers' ``convert_moe_packed_tensors``);
- per-weight (compressed-tensors ``mxfp4-pack-quantized``, DeepSeek-V4-style exports): ``weight`` or
  ``weight_packed`` ``[..., rows, cols / 2]`` uint8 beside ``weight_scale`` ``[..., rows, cols / 32]`` in uint8
  or float8_e8m0fnu.
"""

from __future__ import annotations

import torch

from freetoken.quant import e2m1
from freetoken.quant.base import QuantizationError, WeightFormat

GROUP = 32  # elements per scale
E8M0_BIAS = 127
_EMAX = 2  # e2m1's largest value is 1.5 * 2^2


class Mxfp4Format(WeightFormat):
    name = "mxfp4"
    packed_dtype = torch.uint8
    scale_dtype = torch.uint8
    checkpoint_dtypes = ("U8",)
    scale_checkpoint_dtypes = ("U8", "F8_E8M0")

    def __repr__(self) -> str:
        return "Mxfp4Format()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mxfp4Format)

    def __hash__(self) -> int:
        return hash(self.name)

    def packed_cols(self, cols: int) -> int:
        return cols // 2

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        return (rows, cols // GROUP)

    def scale_name(self, weight_name: str) -> str:
        if weight_name.endswith("_blocks"):
            return weight_name[: -len("_blocks")] + "_scales"
        if weight_name.endswith("weight_packed"):
            return weight_name[: -len("_packed")] + "_scale"
        return weight_name + "_scale"

    def checkpoint_packed_shape(self, weight_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        if weight_name.endswith("_blocks"):
            return (*shape[:-1], shape[-1] // GROUP, GROUP // 2)
        return (*shape[:-1], shape[-1] // 2)

    def checkpoint_scale_shape(self, weight_name: str, packed_shape: tuple[int, ...]) -> tuple[int, ...]:
        if weight_name.endswith("_blocks"):  # [..., rows, groups, 16] -> [..., rows, groups]
            return packed_shape[:-1]
        return (*packed_shape[:-1], packed_shape[-1] * 2 // GROUP)

    def bank_scale(self, scale: torch.Tensor, scale2: torch.Tensor | None = None) -> torch.Tensor:
        if scale.dtype not in (torch.uint8, torch.float8_e8m0fnu):
            raise QuantizationError(f"mxfp4 scales must be uint8 or float8_e8m0fnu (e8m0 bytes), got {scale.dtype}")
        return scale.view(torch.uint8)

    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """``e2m1 * 2^(e - 127)`` in float32 (exact unless it under- or overflows), rounded once to ``dtype``."""
        assert scale is not None
        rows, cols = packed.shape[-2], packed.shape[-1] * 2
        v = e2m1.decode(packed).reshape(*packed.shape[:-1], cols // GROUP, GROUP)
        exp = scale.view(torch.uint8).to(torch.int32) - E8M0_BIAS
        return torch.ldexp(v, exp[..., None]).reshape(*packed.shape[:-2], rows, cols).to(dtype)

    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-group scale ``2^(floor(log2 amax) - 2)`` (the OCP MX rule; a group of zeros gets 2^0), elements
        rounded to nearest e2m1 (saturating)."""
        rows, cols = w.shape[-2:]
        self._check_cols(cols, "weight")
        g = w.float().reshape(*w.shape[:-1], cols // GROUP, GROUP)
        amax = g.abs().amax(dim=-1)
        exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - _EMAX, torch.zeros_like(amax))
        exp = exp.clamp(-E8M0_BIAS, E8M0_BIAS)
        codes = e2m1.encode(torch.ldexp(g, -exp[..., None].to(torch.int32)))
        packed = e2m1.pack(codes.reshape(*w.shape[:-1], cols))
        return packed, (exp + E8M0_BIAS).to(torch.uint8).contiguous()

    def checkpoint_tensors(self, weight_name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        packed, scale = self.quantize(w)
        assert scale is not None
        if weight_name.endswith("_blocks"):
            packed = packed.reshape(*packed.shape[:-1], -1, GROUP // 2)
        return {weight_name: packed, self.scale_name(weight_name): scale}

    def check_expert_shape(self, rows: int, cols: int, what: str) -> None:
        self._check_cols(cols, what)

    @staticmethod
    def _check_cols(cols: int, what: str) -> None:
        if cols % GROUP:
            raise QuantizationError(f"{what} has {cols} columns, not whole mxfp4 groups of {GROUP}")


MXFP4 = Mxfp4Format()
