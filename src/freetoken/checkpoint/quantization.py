"""Refuse what the loader cannot read correctly, before anything is read: quantised checkpoints and tensors
in dtypes that are not plain floating point (each would load and produce wrong tokens otherwise).

The loader reads float32/float16/bfloat16/float64 weights and converts them to the compute dtype; a
checkpoint that declares ``quantization_config`` (fp8 block scales, GPTQ, AWQ, MXFP4, ...) or ships int,
fp8 or packed tensors gets one line naming the method and the tensors, until quantised experts exist.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.safetensors_io import SafetensorsReader

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# Name endings of quantisation side tensors: scales, zero points, packed blocks (fp8, GPTQ/AWQ, MXFP4, ...).
SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale", "input_scale", "weight_zero_point", "qweight", "qzeros",
                  "scales", "g_idx", "_blocks", "_scales")  # fmt: skip
_TYPE_NAMES = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I8": "int8", "U8": "uint8", "I32": "int32",
               "I16": "int16", "I64": "int64", "BOOL": "bool"}  # fmt: skip


def check_supported(raw_config: Mapping[str, Any], reader: SafetensorsReader, skippable: tuple[str, ...] = ()) -> None:
    """Raise CheckpointError when the checkpoint is quantised or holds tensors of a dtype the loader does not
    read (``skippable``: fnmatch patterns of tensors nobody reads, which may have any dtype)."""
    names = [n for n in reader.tensors if not any(fnmatch.fnmatchcase(n, p) for p in skippable)]
    odd = sorted({reader.tensors[n].dtype_name for n in names} - set(FLOAT_DTYPES))
    odd_names = sorted(n for n in names if reader.tensors[n].dtype_name not in FLOAT_DTYPES)
    scale_kinds = sorted({_scale_kind(n) for n in names} - {""})
    qc = raw_config.get("quantization_config") or raw_config.get("compression_config")
    where = reader.directory
    if isinstance(qc, Mapping):
        method = str(qc.get("quant_method") or qc.get("format") or "unknown")
        details = [*_config_details(qc), *scale_kinds, *(_TYPE_NAMES.get(d, d) for d in odd)]
        said = f" ({', '.join(details)})" if details else ""
        raise CheckpointError(f"{where}: uses quantization {method!r}{said}: not supported yet")
    if odd_names:
        dtypes = ", ".join(_TYPE_NAMES.get(d, d) for d in odd)
        kinds = f", and {', '.join(scale_kinds)} tensors" if scale_kinds else ""
        raise CheckpointError(
            f"{where}: {len(odd_names)} tensor(s) in {dtypes}, e.g. {odd_names[0]}{kinds} (quantised without a "
            "quantization_config?): not supported yet"
        )


def _scale_kind(name: str) -> str:
    last = name.rsplit(".", 1)[-1]
    for suffix in SCALE_SUFFIXES:
        if last == suffix or (suffix.startswith("_") and last.endswith(suffix)):
            return suffix.lstrip("_")
    return ""


def _config_details(qc: Mapping[str, Any]) -> list[str]:
    out = []
    block = qc.get("weight_block_size")
    if isinstance(block, (list, tuple)) and block:
        out.append("block " + "x".join(str(b) for b in block))
    if qc.get("bits"):
        out.append(f"{qc['bits']}-bit")
    if qc.get("group_size"):
        out.append(f"group {qc['group_size']}")
    return out
