"""DeepSeek-V4's released quantisation (DeepSeek-V4-Flash): two formats in one checkpoint, told apart by name.

config.json: ``quantization_config`` ``{quant_method: fp8, fmt: e4m3, scale_fmt: ue8m0, weight_block_size: [128, 128],
activation_scheme: dynamic}`` and ``expert_dtype: "fp4"`` (at the top level in V4's config.json; transformers moves
it into ``quantization_config``, as V4.1 ships it). Tensors, in DeepSeek's own names:

- routed experts ``*.ffn.experts.{e}.w{1,2,3}.weight``: MXFP4 (``quant/mxfp4.py``), e2m1 codes two a byte, int8
  (or uint8) ``[rows, cols / 2]``, beside ``.scale`` e8m0 (float8_e8m0fnu, or its bytes in uint8)
  ``[rows, cols / 32]``. Banked packed, byte for byte: the pool, the slots and the kernels read them so.
- every other quantised linear weight (attention ``wq_a``/``wq_b``/``wkv``/``wo_a``/``wo_b``, the indexer's ``wq_b``,
  the shared expert): FP8 e4m3 ``[rows, cols]`` beside ``.scale`` ``[ceil(rows / 128), ceil(cols / 128)]`` in e8m0
  (``scale_fmt: ue8m0``: powers of two) or float32 (``scale_fmt: float``): ``w = fp8 * scale`` per block.
  Dequantised to the compute dtype at load (``quant/fp8_block.py``'s reference).
- the rest (embeddings, head, norms, routers, the compressors' projections, hyper-connections, sinks) in bf16/f32.

What the layout lacks is refused naming the field or the tensor: another method, element format or block size; FP8
routed experts (``expert_dtype: fp8``, or an e4m3 expert tensor); a scale of the wrong dtype or shape; a scale
beside an unpacked weight; an FP4 tensor outside the routed experts. ``Dsv4Layout`` is a ``PackedLayout``
(``checkpoint/quantization.py``) whose methods pick the format by the tensor's name, or by the packed dtype where
only the tensor is given (``dequantize``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from freetoken.quant.base import QuantizationError
from freetoken.quant.fp8_block import FP8_BLOCK_128
from freetoken.quant.mxfp4 import E8M0_BIAS, GROUP, MXFP4
from freetoken.quant.registry import quantization_section

EXPERT = re.compile(r"(^|\.)ffn\.experts\.\d+\.w[123]\.weight$")  # a routed expert's weight, by DeepSeek's name
FP4_DTYPES = ("I8", "U8")  # safetensors names of the packed e2m1 bytes
FP8_DTYPES = ("F8_E4M3",)
E8M0_DTYPES = ("F8_E8M0", "U8")
FLOAT_SCALE_DTYPES = ("F32", "BF16")
SCALE_FMTS = ("ue8m0", "float")


def is_expert(name: str) -> bool:
    return EXPERT.search(name) is not None


def _expert_dtype(raw: Mapping[str, Any], qc: Mapping[str, Any]) -> str:
    """``expert_dtype`` where either place has it; absent, the tensors decide (``check_tensors``: int8 experts are
    read as MXFP4, e4m3 ones refused by name)."""
    v = qc.get("expert_dtype", raw.get("expert_dtype"))
    return "fp4" if v is None else str(v)


def layout_from_config(raw: Mapping[str, Any]) -> Dsv4Layout | None:
    """config.json's quantisation -> the layout (None: not quantised); what it lacks refused naming the field."""
    section = quantization_section(raw)
    if section is None:
        return None
    qc, method = section
    if method != "fp8":
        raise QuantizationError(f"quantization_config uses {method!r}: DeepSeek-V4 is read as released (quant_method "
                                "'fp8' with MXFP4 routed experts)")  # fmt: skip
    fmt = qc.get("fmt")
    if fmt is not None and str(fmt) not in ("e4m3", "float8_e4m3fn"):
        raise QuantizationError(f"quantization_config fmt {fmt!r}: only e4m3 is implemented")
    scheme = qc.get("activation_scheme")
    if scheme is not None and scheme != "dynamic":
        raise QuantizationError(f"quantization_config activation_scheme {scheme!r}: only 'dynamic' is implemented")
    block = qc.get("weight_block_size")
    if not isinstance(block, (list, tuple)) or [*block] != [*FP8_BLOCK_128.block]:
        raise QuantizationError(f"quantization_config weight_block_size {block!r}: only "
                                f"{list(FP8_BLOCK_128.block)} is implemented")  # fmt: skip
    scale_fmt = str(qc.get("scale_fmt") or "float")
    if scale_fmt not in SCALE_FMTS:
        raise QuantizationError(f"quantization_config scale_fmt {scale_fmt!r}: one of {', '.join(SCALE_FMTS)} is")
    experts = _expert_dtype(raw, qc)
    if experts != "fp4":
        raise QuantizationError(f"expert_dtype {experts!r}: DeepSeek-V4's routed experts are read in fp4 (MXFP4) "
                                "only; FP8 routed experts are not implemented")  # fmt: skip
    return Dsv4Layout(scale_fmt)


class Dsv4Layout:
    """The two formats of the release as one ``PackedLayout``; the routed experts' bank format is ``MXFP4``."""

    name: str
    checkpoint_dtypes: tuple[str, ...] = (*FP8_DTYPES, *FP4_DTYPES)
    scale_checkpoint_dtypes: tuple[str, ...] = (*E8M0_DTYPES, *FLOAT_SCALE_DTYPES)
    ignored_suffixes: tuple[str, ...] = ()
    expert_format = MXFP4

    def __init__(self, scale_fmt: str = "ue8m0") -> None:
        self.scale_fmt = scale_fmt
        self.name = f"DeepSeek-V4 fp8 e4m3 {'x'.join(map(str, FP8_BLOCK_128.block))} ({scale_fmt}) + mxfp4 experts"

    def __repr__(self) -> str:
        return f"Dsv4Layout({self.scale_fmt!r})"

    def scale_name(self, weight_name: str) -> str:
        return weight_name.removesuffix(".weight") + ".scale"

    def scale2_name(self, weight_name: str) -> str:
        return ""

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        """The routed experts' scale rows (banks, ``models/blocks.expert_reads``)."""
        return MXFP4.scale_shape(rows, cols)

    def checkpoint_packed_shape(self, weight_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        if is_expert(weight_name):
            return (*shape[:-1], shape[-1] // 2)
        return tuple(shape)

    def checkpoint_scale_shape(self, weight_name: str, packed_shape: tuple[int, ...]) -> tuple[int, ...]:
        lead, rows, cols = tuple(packed_shape[:-2]), packed_shape[-2], packed_shape[-1]
        if is_expert(weight_name):
            return (*lead, rows, cols * 2 // GROUP)
        return (*lead, *FP8_BLOCK_128.scale_shape(rows, cols))

    def bank_scale(self, scale: torch.Tensor, scale2: torch.Tensor | None = None) -> torch.Tensor:
        """e8m0 scales as their bytes (uint8: MXFP4's bank scales; FP8's are widened in ``dequantize``), float
        scales as float32."""
        if scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
            return scale.view(torch.uint8)
        if scale.dtype.is_floating_point and scale.dtype.itemsize >= 2:
            return scale.float()
        raise QuantizationError(f"scales must be e8m0 (float8_e8m0fnu or uint8) or float, got {scale.dtype}")

    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """By the packed dtype: e2m1 bytes (int8/uint8) -> MXFP4's reference; e4m3 -> FP8 blocks' reference, with
        e8m0 scales widened to float32 exactly (``2^(s - 127)``)."""
        assert scale is not None
        if packed.dtype in (torch.int8, torch.uint8):
            if scale.dtype != torch.uint8:
                raise QuantizationError(f"mxfp4 scales must be e8m0, got {scale.dtype}")
            return MXFP4.dequantize(packed.view(torch.uint8), scale, dtype)
        if scale.dtype == torch.uint8:
            one = torch.ones(scale.shape, dtype=torch.float32)
            scale = torch.ldexp(one, scale.to(torch.int32) - E8M0_BIAS)
        return FP8_BLOCK_128.dequantize(packed, scale, dtype)


def check_tensors(layout: Dsv4Layout, headers: Mapping[str, tuple[str, tuple[int, ...]]]) -> None:
    """What the generic header check (``checkpoint.quantization.check_supported``) cannot know by dtype alone, from
    ``{name: (safetensors dtype, shape)}``: routed experts are FP4 (never FP8), FP4 bytes sit in routed experts only,
    each format's scales are of its dtypes, and a ``.scale`` sits beside a packed weight."""
    for name, (dt, _) in headers.items():
        if name.endswith(".scale"):
            continue
        if is_expert(name) and dt in FP8_DTYPES:
            raise QuantizationError(f"routed expert {name} is FP8 e4m3: DeepSeek-V4's FP8 routed experts are not "
                                    "implemented (the release's are MXFP4)")  # fmt: skip
        if not is_expert(name) and dt in FP4_DTYPES and layout.scale_name(name) in headers:
            raise QuantizationError(f"{name} is packed FP4 ({dt}) outside the routed experts: not implemented")
    for name, (dt, _) in headers.items():
        if not name.endswith(".scale"):
            continue
        weight = name.removesuffix(".scale") + ".weight"
        wdt = headers.get(weight, ("", ()))[0]
        if wdt not in layout.checkpoint_dtypes:
            raise QuantizationError(f"scale tensor {name} sits beside {weight}, which is not packed "
                                    f"({wdt or 'missing'})")  # fmt: skip
        if is_expert(weight) and dt not in E8M0_DTYPES:
            raise QuantizationError(f"scale tensor {name} is {dt}: mxfp4 expert scales are e8m0 (float8_e8m0fnu or "
                                    "uint8)")  # fmt: skip
