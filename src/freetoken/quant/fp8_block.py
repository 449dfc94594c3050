"""FP8 e4m3 weights with one float32 scale per block of ``block[0]`` rows x ``block[1]`` columns: the layout of the
Qwen3/3.5/3.6, DeepSeek, GLM and MiniMax FP8 releases (``quant_method: fp8``, ``weight_block_size: [128, 128]``,
a ``weight_scale_inv`` beside each ``weight``: despite its name it multiplies, ``w = fp8 * weight_scale_inv``).

The packed tensor is the fp8 weight itself (``[rows, cols]``, one byte per weight); the scale tensor is
``[ceil(rows / block[0]), ceil(cols / block[1])]`` float32 (checkpoints may ship bf16 scales: read as float32).
Kernels (CPU and GPU) address whole blocks: routed experts must be whole blocks in both dimensions, and since
gate and up rows share one bank, the intermediate size too. Non-expert weights are dequantised at load, any shape.
"""

from __future__ import annotations

import torch

from freetoken.quant.base import QuantizationError, WeightFormat

E4M3_MAX = 448.0
IMPLEMENTED_BLOCKS = ((128, 128),)


class Fp8BlockFormat(WeightFormat):
    name = "fp8_block"
    packed_dtype = torch.float8_e4m3fn
    scale_dtype = torch.float32
    checkpoint_dtypes = ("F8_E4M3",)

    def __init__(self, block: tuple[int, int] = (128, 128)) -> None:
        if tuple(block) not in IMPLEMENTED_BLOCKS:
            raise QuantizationError(f"fp8 block {list(block)} is not implemented (only {list(IMPLEMENTED_BLOCKS[0])})")
        self.block = (int(block[0]), int(block[1]))

    def __repr__(self) -> str:
        return f"Fp8BlockFormat(block={self.block})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fp8BlockFormat) and other.block == self.block

    def __hash__(self) -> int:
        return hash((self.name, self.block))

    def packed_cols(self, cols: int) -> int:
        return cols

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        return (-(-rows // self.block[0]), -(-cols // self.block[1]))

    def scale_name(self, weight_name: str) -> str:
        return weight_name + "_scale_inv"  # "...weight" -> "...weight_scale_inv", "...gate_up_proj" -> "..._scale_inv"

    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """``fp8.float() * scale`` per block, rounded once to ``dtype`` (transformers' ``Fp8Dequantize``, extended
        to partial edge blocks)."""
        assert scale is not None
        br, bc = self.block
        rows, cols = packed.shape[-2:]
        if rows % br == 0 and cols % bc == 0:  # whole blocks: broadcast the scales over a blocked view
            lead, sr, sc = packed.shape[:-2], rows // br, cols // bc
            q = packed.float().reshape(*lead, sr, br, sc, bc)
            return (q * scale.float().reshape(*lead, sr, 1, sc, 1)).to(dtype).reshape(packed.shape)
        s = scale.float().repeat_interleave(br, dim=-2)[..., :rows, :].repeat_interleave(bc, dim=-1)[..., :cols]
        return (packed.float() * s).to(dtype)

    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-block amax / 448 scales (a block of zeros gets scale 1), values rounded to e4m3."""
        br, bc = self.block
        rows, cols = w.shape[-2:]
        sr, sc = self.scale_shape(rows, cols)
        lead = w.shape[:-2]
        padded = torch.zeros((*lead, sr * br, sc * bc), dtype=torch.float32, device=w.device)
        padded[..., :rows, :cols] = w.float()
        blocks = padded.reshape(*lead, sr, br, sc, bc)
        amax = blocks.abs().amax(dim=(-3, -1))
        scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        q = (blocks / scale[..., :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return q.reshape(*lead, sr * br, sc * bc)[..., :rows, :cols].contiguous(), scale.contiguous()

    def check_expert_shape(self, rows: int, cols: int, what: str) -> None:
        br, bc = self.block
        if rows % br or cols % bc:
            raise QuantizationError(
                f"{what} [{rows}, {cols}] is not whole {br}x{bc} fp8 blocks: routed experts of partial blocks are "
                "not implemented"
            )


FP8_BLOCK_128 = Fp8BlockFormat((128, 128))
