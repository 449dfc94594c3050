"""A checkpoint's ``quantization_config`` -> the weight format its quantised tensors are in (None: none declared).

Implemented: ``quant_method: fp8`` with e4m3 weights, dynamic activations and 128x128 block scales. Anything
else fails here, before a tensor is read, naming what the checkpoint declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from freetoken.quant.base import QuantizationError, WeightFormat
from freetoken.quant.fp8_block import IMPLEMENTED_BLOCKS, Fp8BlockFormat

_E4M3_NAMES = ("e4m3", "float8_e4m3fn")


def format_by_name(name: str) -> WeightFormat:
    """A format by its ``name`` (benchmark presets, command lines): "bf16" or "fp8_block" (128x128)."""
    from freetoken.quant.bf16 import BF16
    from freetoken.quant.fp8_block import FP8_BLOCK_128

    formats: dict[str, WeightFormat] = {f.name: f for f in (BF16, FP8_BLOCK_128)}
    if name not in formats:
        raise ValueError(f"unknown weight format {name!r}; choose from {', '.join(formats)}")
    return formats[name]


def format_from_config(raw_config: Mapping[str, Any]) -> WeightFormat | None:
    """The format declared by ``config.json``'s ``quantization_config`` (or ``compression_config``)."""
    qc = raw_config.get("quantization_config") or raw_config.get("compression_config")
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise QuantizationError(f"quantization_config must be an object, got {type(qc).__name__}")
    method = str(qc.get("quant_method") or qc.get("format") or "unknown")
    if method != "fp8":
        raise QuantizationError(f"uses quantization {method!r}{_details(qc)}: not supported yet")
    fmt = qc.get("fmt")
    if fmt is not None and str(fmt) not in _E4M3_NAMES:
        raise QuantizationError(f"uses fp8 weights in {fmt!r}: only e4m3 is implemented")
    scheme = qc.get("activation_scheme")
    if scheme is not None and scheme != "dynamic":
        raise QuantizationError(f"uses fp8 with activation_scheme {scheme!r}: only 'dynamic' is implemented")
    block = qc.get("weight_block_size")
    if block is None:
        raise QuantizationError("uses fp8 with one scale per tensor (no weight_block_size): not supported yet")
    if not isinstance(block, (list, tuple)) or len(block) != 2 or tuple(block) not in IMPLEMENTED_BLOCKS:
        raise QuantizationError(
            f"uses fp8 with weight_block_size {list(block) if isinstance(block, (list, tuple)) else block!r}: "
            f"only {list(IMPLEMENTED_BLOCKS[0])} is implemented"
        )
    return Fp8BlockFormat((int(block[0]), int(block[1])))


def _details(qc: Mapping[str, Any]) -> str:
    out = []
    block = qc.get("weight_block_size")
    if isinstance(block, (list, tuple)) and block:
        out.append("block " + "x".join(str(b) for b in block))
    if qc.get("bits"):
        out.append(f"{qc['bits']}-bit")
    if qc.get("group_size"):
        out.append(f"group {qc['group_size']}")
    return f" ({', '.join(out)})" if out else ""
