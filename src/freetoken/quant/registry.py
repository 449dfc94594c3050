"""A checkpoint's ``quantization_config`` -> the weight format its quantised tensors are in (None: none declared).

Implemented: ``quant_method: fp8`` with e4m3 weights, dynamic activations and 128x128 block scales;
``quant_method: mxfp4`` (gpt-oss); ``quant_method: modelopt`` with ``quant_algo: NVFP4`` (config.json or
``hf_quant_config.json``, which ``checkpoint/hf_config.py`` reads into the same place); ``compressed-tensors``
with ``nvfp4-pack-quantized`` or ``mxfp4-pack-quantized`` weight groups. Anything else fails here, before a
tensor is read, naming what the checkpoint declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from freetoken.quant.base import QuantizationError, WeightFormat
from freetoken.quant.fp8_block import IMPLEMENTED_BLOCKS, Fp8BlockFormat

_E4M3_NAMES = ("e4m3", "float8_e4m3fn")
_CT_FORMATS = {"nvfp4-pack-quantized": ("nvfp4", 16), "mxfp4-pack-quantized": ("mxfp4", 32)}


def format_by_name(name: str) -> WeightFormat:
    """A format by its ``name`` (benchmark presets, command lines, FTW manifests): "bf16", "fp8_block" (128x128),
    "mxfp4" or "nvfp4" (banks of either NVFP4 checkpoint layout are alike)."""
    from freetoken.quant.bf16 import BF16
    from freetoken.quant.fp8_block import FP8_BLOCK_128
    from freetoken.quant.mxfp4 import MXFP4
    from freetoken.quant.nvfp4 import NVFP4

    formats: dict[str, WeightFormat] = {f.name: f for f in (BF16, FP8_BLOCK_128, MXFP4, NVFP4)}
    if name not in formats:
        raise ValueError(f"unknown weight format {name!r}; choose from {', '.join(formats)}")
    return formats[name]


def quantization_section(raw_config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str] | None:
    """``config.json``'s ``quantization_config`` (or ``compression_config``) and its method name; None when it has
    none; an object of another type refused."""
    qc = raw_config.get("quantization_config") or raw_config.get("compression_config")
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise QuantizationError(f"quantization_config must be an object, got {type(qc).__name__}")
    return qc, str(qc.get("quant_method") or qc.get("format") or "unknown")


def format_from_config(raw_config: Mapping[str, Any]) -> WeightFormat | None:
    """The format declared by ``config.json``'s ``quantization_config`` (or ``compression_config``)."""
    section = quantization_section(raw_config)
    if section is None:
        return None
    qc, method = section
    if method == "mxfp4":
        from freetoken.quant.mxfp4 import MXFP4

        return MXFP4
    if method == "modelopt":
        return _modelopt(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method != "fp8":
        raise QuantizationError(f"uses quantization {method!r}{_details(qc)}: not supported yet")
    return _fp8(qc)


def _fp8(qc: Mapping[str, Any]) -> WeightFormat:
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


def _modelopt(qc: Mapping[str, Any]) -> WeightFormat:
    from freetoken.quant.nvfp4 import NVFP4

    algo = str(qc.get("quant_algo") or "unknown")
    if algo.upper() != "NVFP4":
        raise QuantizationError(f"uses quantization 'modelopt' with quant_algo {algo!r}: only NVFP4 is implemented")
    group = qc.get("group_size")
    if group is not None and int(group) != 16:
        raise QuantizationError(f"uses modelopt NVFP4 with group_size {group}: the format has 16")
    return NVFP4


def _compressed_tensors(qc: Mapping[str, Any]) -> WeightFormat:
    """One format over every config group (its ``format``, else the top-level one), with the group size the
    format has; weight-only: activation quantisation is ignored, as the format's kernels here never use it."""
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not groups:
        raise QuantizationError("uses quantization 'compressed-tensors' without config_groups: not supported yet")
    found: set[str] = set()
    for gname, g in groups.items():
        fmt = str((g or {}).get("format") or qc.get("format") or "unknown")
        if fmt not in _CT_FORMATS:
            raise QuantizationError(f"uses compressed-tensors format {fmt!r} (group {gname}): not supported yet")
        want = _CT_FORMATS[fmt][1]
        weights = (g or {}).get("weights") or {}
        size, bits, kind = weights.get("group_size"), weights.get("num_bits"), weights.get("type")
        if size is not None and int(size) != want:
            raise QuantizationError(f"uses compressed-tensors {fmt} with group_size {size} (group {gname}): the "
                                    f"format has {want}")  # fmt: skip
        if (bits is not None and int(bits) != 4) or (kind is not None and kind != "float"):
            raise QuantizationError(f"uses compressed-tensors {fmt} with {bits}-bit {kind} weights (group {gname}): "
                                    "only 4-bit float is implemented")  # fmt: skip
        found.add(_CT_FORMATS[fmt][0])
    if len(found) > 1:
        raise QuantizationError(f"uses compressed-tensors groups of several formats ({', '.join(sorted(found))}): "
                                "one format per checkpoint is implemented")  # fmt: skip
    from freetoken.quant.mxfp4 import MXFP4
    from freetoken.quant.nvfp4 import NVFP4_COMPRESSED_TENSORS

    return NVFP4_COMPRESSED_TENSORS if found == {"nvfp4"} else MXFP4


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
