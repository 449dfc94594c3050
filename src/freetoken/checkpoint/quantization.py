"""Refuse what the loader cannot read correctly, before anything is read (headers only): tensors in dtypes that are
neither plain floating point nor the packed dtype of the checkpoint's declared weight format, packed weights
without their scale tensor (or second, per-tensor scale) or with one of the wrong shape or dtype (each format
names its scale dtypes: float for fp8 blocks, uint8/e8m0 for MXFP4, float8 e4m3 for NVFP4), and scale tensors
beside unpacked weights. Each would load and produce wrong tokens otherwise.

The format itself (``quantization_config`` -> a ``quant/`` format) is read by the engine's model assembly and
handed in as a ``PackedLayout``: ``checkpoint/`` and ``quant/`` sit on one row of the layering and do not import
each other. Without a format, a checkpoint declaring quantisation, or shipping int/fp8/packed tensors, gets one
line naming the method and the tensors.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.safetensors_io import SafetensorsReader

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# Name endings of quantisation side tensors: scales, zero points, packed blocks (fp8, GPTQ/AWQ, MXFP4, ...).
SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale", "input_scale", "weight_zero_point", "qweight", "qzeros",
                  "scales", "g_idx", "_blocks", "_scales", "weight_scale_2", "weight_global_scale",
                  "weight_packed")  # fmt: skip
# Name endings of scale tensors that must sit beside a packed weight of the declared format.
_SIDE_SUFFIXES = ("_scale_inv", "weight_scale", "weight_scale_2", "weight_global_scale", "_scales")
_TYPE_NAMES = {"F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "F8_E5M2": "float8_e5m2", "I8": "int8",
               "U8": "uint8", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I32": "int32",
               "I16": "int16", "I64": "int64", "BOOL": "bool"}  # fmt: skip


class PackedLayout(Protocol):
    """What reading a packed weight needs of its format (every ``quant/`` format is one)."""

    name: str
    checkpoint_dtypes: tuple[str, ...]
    scale_checkpoint_dtypes: tuple[str, ...]
    ignored_suffixes: tuple[str, ...]

    def scale_name(self, weight_name: str) -> str: ...

    def scale2_name(self, weight_name: str) -> str: ...

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]: ...

    def checkpoint_packed_shape(self, weight_name: str, shape: tuple[int, ...]) -> tuple[int, ...]: ...

    def checkpoint_scale_shape(self, weight_name: str, packed_shape: tuple[int, ...]) -> tuple[int, ...]: ...

    def bank_scale(self, scale: torch.Tensor, scale2: torch.Tensor | None = None) -> torch.Tensor: ...

    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor: ...


def check_supported(
    raw_config: Mapping[str, Any],
    reader: SafetensorsReader,
    skippable: tuple[str, ...] = (),
    layout: PackedLayout | None = None,
) -> None:
    """Raise CheckpointError when the checkpoint holds tensors the loader would read wrong (``skippable``: fnmatch
    patterns of tensors nobody reads, which may have any dtype; ``layout``: the declared weight format, None when
    the checkpoint declares none or the caller reads none)."""
    names = [n for n in reader.tensors if not any(fnmatch.fnmatchcase(n, p) for p in skippable)]
    allowed = set(FLOAT_DTYPES)
    if layout is not None:
        allowed |= set(layout.checkpoint_dtypes) | set(layout.scale_checkpoint_dtypes)
    odd = sorted({reader.tensors[n].dtype_name for n in names} - allowed)
    odd_names = sorted(n for n in names if reader.tensors[n].dtype_name not in allowed)
    scale_kinds = sorted({_scale_kind(n) for n in names} - {""})
    qc = raw_config.get("quantization_config") or raw_config.get("compression_config")
    where = reader.directory
    if isinstance(qc, Mapping) and layout is None:  # a caller that reads no format (quant/ refuses what it lacks)
        method = str(qc.get("quant_method") or qc.get("format") or "unknown")
        details = [*scale_kinds, *(_TYPE_NAMES.get(d, d) for d in odd)]
        said = f" ({', '.join(details)})" if details else ""
        raise CheckpointError(f"{where}: uses quantization {method!r}{said}: not supported yet")
    if odd_names:
        dtypes = ", ".join(_TYPE_NAMES.get(d, d) for d in odd)
        kinds = f", and {', '.join(scale_kinds)} tensors" if scale_kinds else ""
        declared = f"{layout.name} declared" if layout is not None else "quantised without a quantization_config?"
        raise CheckpointError(
            f"{where}: {len(odd_names)} tensor(s) in {dtypes}, e.g. {odd_names[0]}{kinds} ({declared}): "
            "not supported yet"
        )
    if layout is not None:
        _check_scales(reader, names, layout)


def packed_names(reader: SafetensorsReader, names: list[str], layout: PackedLayout) -> list[str]:
    """The packed weights among ``names``: tensors in the layout's packed dtype that are not some packed tensor's
    scale (MXFP4 scales are uint8 too)."""
    candidates = [n for n in names if reader.tensors[n].dtype_name in layout.checkpoint_dtypes]
    scales = {layout.scale_name(n) for n in candidates}
    return [n for n in candidates if n not in scales]


def _check_scales(reader: SafetensorsReader, names: list[str], layout: PackedLayout) -> None:
    """Every packed weight has its scale tensors, of the format's dtype and the shape its blocks imply; every scale
    tensor sits beside a packed weight."""
    where = reader.directory
    scales: set[str] = set()
    for n in packed_names(reader, names, layout):
        info = reader.tensors[n]
        s, s2 = layout.scale_name(n), layout.scale2_name(n)
        scales.update((s, s2))
        if len(info.shape) < 2:
            raise CheckpointError(f"{where}: tensor {n} is packed ({layout.name}) but has shape {list(info.shape)}")
        if s not in reader.tensors:
            raise CheckpointError(f"{where}: tensor {n} is packed ({layout.name}) but its scale tensor {s} is missing")
        got = reader.tensors[s]
        want = layout.checkpoint_scale_shape(n, info.shape)
        if got.shape != want:
            raise CheckpointError(
                f"{where}: scale tensor {s} has shape {list(got.shape)}, but {n} of shape {list(info.shape)} in "
                f"{layout.name} needs {list(want)}"
            )
        if got.dtype_name not in layout.scale_checkpoint_dtypes:
            kinds = ", ".join(_TYPE_NAMES.get(d, d) for d in layout.scale_checkpoint_dtypes)
            dt = _TYPE_NAMES.get(got.dtype_name, got.dtype_name)
            raise CheckpointError(f"{where}: scale tensor {s} has dtype {dt}, {layout.name} scales are {kinds}")
        if s2:
            _check_scale2(reader, n, s2, layout)
    stray = sorted(n for n in names if n.endswith(_SIDE_SUFFIXES) and n not in scales)
    if stray:
        raise CheckpointError(f"{where}: scale tensor {stray[0]} sits beside a weight that is not packed")


def _check_scale2(reader: SafetensorsReader, n: str, s2: str, layout: PackedLayout) -> None:
    """A per-tensor scale: present, float32, one value (or one per leading index of a fused tensor)."""
    where = reader.directory
    if s2 not in reader.tensors:
        raise CheckpointError(f"{where}: tensor {n} is packed ({layout.name}) but its per-tensor scale {s2} is missing")
    got, lead = reader.tensors[s2], reader.tensors[n].shape[:-2]
    count = 1
    for d in got.shape:
        count *= d
    lead_count = 1
    for d in lead:
        lead_count *= d
    if got.dtype_name != "F32" or count not in (1, lead_count):
        raise CheckpointError(f"{where}: per-tensor scale {s2} is {got.dtype_name} {list(got.shape)}, {layout.name} "
                              f"needs float32 with one value (or {lead_count})")  # fmt: skip


def _scale_kind(name: str) -> str:
    last = name.rsplit(".", 1)[-1]
    for suffix in SCALE_SUFFIXES:
        if last == suffix or (suffix.startswith("_") and last.endswith(suffix)):
            return suffix.lstrip("_")
    return ""
