"""Weight formats: one file per format (``bf16.py``, ``fp8_block.py``, ``mxfp4.py``, ``nvfp4.py``; ``e2m1.py`` the
FP4 elements both FP4 formats share), each its layout, its scales and a torch reference dequantisation;
``registry.py`` reads a checkpoint's ``quantization_config`` into one."""

from freetoken.quant.base import QuantizationError, WeightFormat
from freetoken.quant.bf16 import BF16
from freetoken.quant.fp8_block import FP8_BLOCK_128, Fp8BlockFormat
from freetoken.quant.mxfp4 import MXFP4, Mxfp4Format
from freetoken.quant.nvfp4 import NVFP4, NVFP4_COMPRESSED_TENSORS, Nvfp4Format
from freetoken.quant.registry import format_by_name, format_from_config

__all__ = [
    "BF16",
    "FP8_BLOCK_128",
    "MXFP4",
    "NVFP4",
    "NVFP4_COMPRESSED_TENSORS",
    "Fp8BlockFormat",
    "Mxfp4Format",
    "Nvfp4Format",
    "QuantizationError",
    "WeightFormat",
    "format_by_name",
    "format_from_config",
]
