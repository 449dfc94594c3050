"""Weight formats: one file per format (``bf16.py``, ``fp8_block.py``), each its layout, its scales and a torch
reference dequantisation; ``registry.py`` reads a checkpoint's ``quantization_config`` into one."""

from freetoken.quant.base import QuantizationError, WeightFormat
from freetoken.quant.bf16 import BF16
from freetoken.quant.fp8_block import FP8_BLOCK_128, Fp8BlockFormat
from freetoken.quant.registry import format_by_name, format_from_config

__all__ = ["BF16", "FP8_BLOCK_128", "Fp8BlockFormat", "QuantizationError", "WeightFormat", "format_by_name",
           "format_from_config"]
