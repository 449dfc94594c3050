"""The weight formats of ``quant/``: the fp8-block reference dequantisation equals transformers' own, the reference
quantiser round-trips, and ``quantization_config`` is read or refused by what it declares."""

from __future__ import annotations

import pytest
import torch

from freetoken.quant import BF16, FP8_BLOCK_128, Fp8BlockFormat, QuantizationError, format_from_config


def _transformers_dequant(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    return Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=dtype)


@pytest.mark.parametrize("shape", [(256, 128), (3, 128, 384)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_dequantize_equals_transformers(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=g) * 0.2
    q, s = FP8_BLOCK_128.quantize(w)
    assert q.dtype == torch.float8_e4m3fn and s is not None and s.dtype == torch.float32
    assert tuple(s.shape) == (*shape[:-2], shape[-2] // 128, shape[-1] // 128)
    ours = FP8_BLOCK_128.dequantize(q, s, dtype)
    assert torch.equal(ours, _transformers_dequant(q, s, dtype))
    # e4m3 keeps 3 mantissa bits: the round trip is within half an ulp of the block's scale-relative value
    assert float(((ours.float() - w).abs() / w.abs().clamp(min=1e-3)).median()) < 0.04


def test_fp8_partial_edge_blocks_dequantize_per_block() -> None:
    """DeepSeek's kv_a_proj [576, 7168]-like shapes: the last block row is partial (scales rounded up)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(200, 130, generator=g)
    q, s = FP8_BLOCK_128.quantize(w)
    assert s is not None and tuple(s.shape) == (2, 2)
    ours = FP8_BLOCK_128.dequantize(q, s, torch.float32)
    by_hand = q.float().clone()
    for i in range(2):
        for j in range(2):
            by_hand[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] *= s[i, j]
    assert torch.equal(ours, by_hand)


def test_format_sizes() -> None:
    assert FP8_BLOCK_128.row_bytes(1536, 2048, 2) == 1536 * 2048 + 12 * 16 * 4
    assert BF16.row_bytes(1536, 2048, 2) == 1536 * 2048 * 2
    assert BF16.dequantize(torch.ones(2, 2), None, torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(QuantizationError, match=r"\[768, 100\] is not whole 128x128 fp8 blocks"):
        FP8_BLOCK_128.check_expert_shape(768, 100, "down")
    with pytest.raises(QuantizationError, match=r"fp8 block \[64, 64\] is not implemented"):
        Fp8BlockFormat((64, 64))


def test_quantization_config_read() -> None:
    assert format_from_config({}) is None
    qc = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    assert format_from_config({"quantization_config": qc}) == FP8_BLOCK_128


@pytest.mark.parametrize(
    "qc, said",
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "uses quantization 'gptq' (4-bit, group 128)"),
        ({"quant_method": "awq", "bits": 4}, "uses quantization 'awq' (4-bit): not supported yet"),
        ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "weight_block_size [64, 64]: only [128, 128]"),
        ({"quant_method": "fp8", "weight_block_size": [1, 128]}, "weight_block_size [1, 128]: only [128, 128]"),
        ({"quant_method": "fp8"}, "one scale per tensor (no weight_block_size): not supported yet"),
        ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "in 'e5m2': only e4m3"),
        ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
         "activation_scheme 'static'"),
    ],
)
def test_quantization_config_refused(qc: dict, said: str) -> None:
    with pytest.raises(QuantizationError) as err:
        format_from_config({"quantization_config": qc})
    assert said in str(err.value)
