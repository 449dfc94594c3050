"""The FP4 formats of ``quant/`` (MXFP4, NVFP4 in its two checkpoint layouts): hand-computed vectors from the
formats' specifications, the references against independent ones (transformers' ``convert_moe_packed_tensors``
for MXFP4, the ``compressed-tensors`` package's NVFP4 decompressor), the quantisers' round trips, and the
``quantization_config`` readings and refusals."""

from __future__ import annotations

import pytest
import torch

from freetoken.quant import MXFP4, NVFP4, NVFP4_COMPRESSED_TENSORS, QuantizationError, e2m1, format_from_config
from freetoken.quant.nvfp4 import split_bank_scale


def test_e2m1_codes_by_hand() -> None:
    # byte 0x71: low nibble 1 (0.5) first, then 7 (6.0); 0xF8: -0.0 then -6.0; 0x2A: -1.0 then 1.0
    got = e2m1.decode(torch.tensor([[0x71, 0xF8, 0x2A]], dtype=torch.uint8))
    assert got.tolist() == [[0.5, 6.0, -0.0, -6.0, -1.0, 1.0]]
    x = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 9.0, -0.3, -2.9])
    assert e2m1.table()[e2m1.encode(x).long()].tolist() == [0, 0.5, 1, 1, 2, 2, 4, 4, 6, -0.5, -3]  # ties to even
    assert torch.equal(e2m1.unpack(e2m1.pack(torch.arange(16, dtype=torch.uint8))), torch.arange(16).to(torch.uint8))


def test_mxfp4_by_hand() -> None:
    """Group of 32: byte 0x71 with scale 128 (2^1) -> 1.0, 12.0; scale 125 (2^-2) -> 0.125, 1.5."""
    packed = torch.zeros((2, 16), dtype=torch.uint8)
    packed[:, 0] = 0x71
    scale = torch.tensor([[128], [125]], dtype=torch.uint8)
    w = MXFP4.dequantize(packed, scale, torch.float32)
    assert w.shape == (2, 32) and w[0, :2].tolist() == [1.0, 12.0] and w[1, :2].tolist() == [0.125, 1.5]
    assert w[:, 2:].abs().sum() == 0


def test_nvfp4_by_hand() -> None:
    """modelopt: e2m1 1.5 (code 3) x e4m3 0.75 (0x34) x weight_scale_2 2.0 = 2.25; compressed-tensors: the same
    bytes with weight_global_scale 4.0 divide: 1.5 x 0.75 / 4 = 0.28125."""
    packed = torch.zeros((1, 8), dtype=torch.uint8)
    packed[0, 0] = 0x03
    s8 = torch.tensor([[0x34]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert float(s8.float()) == 0.75
    a = NVFP4.dequantize(packed, NVFP4.bank_scale(s8, torch.tensor(2.0)), torch.float32)
    b = NVFP4_COMPRESSED_TENSORS.dequantize(packed, NVFP4_COMPRESSED_TENSORS.bank_scale(s8, torch.tensor([4.0])),
                                            torch.float32)  # fmt: skip
    assert a[0, :2].tolist() == [2.25, 0.0] and b[0, :2].tolist() == [0.28125, 0.0]
    codes, mult = split_bank_scale(NVFP4.bank_scale(s8, torch.tensor(2.0)))
    assert codes.tolist() == [[0x34]] and mult.tolist() == [[2.0]]


@pytest.mark.parametrize("lead", [(), (3,)])
def test_mxfp4_equals_transformers(lead: tuple[int, ...]) -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    w = torch.randn((*lead, 48, 96), generator=g) * 0.1
    t = MXFP4.checkpoint_tensors("e.gate_up_proj_blocks", w.reshape(-1, 48, 96))
    blocks, scales = t["e.gate_up_proj_blocks"], t["e.gate_up_proj_scales"]
    assert blocks.shape == ((lead or (1,))[0], 48, 3, 16) and scales.shape == ((lead or (1,))[0], 48, 3)
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)  # it returns [E, cols, rows]
    packed, scale = MXFP4.quantize(w)
    ours = MXFP4.dequantize(packed, scale, torch.float32).reshape(-1, 48, 96)
    assert torch.equal(ours, ref)
    assert torch.equal(packed.reshape(-1, 48, 48), blocks.reshape(-1, 48, 48))
    assert float(((ours - w.reshape(-1, 48, 96)).abs() / w.abs().amax()).max()) < 0.2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nvfp4_equals_compressed_tensors(dtype: torch.dtype) -> None:
    ct = pytest.importorskip("compressed_tensors")  # a test extra
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    assert ct is not None
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 128, generator=g) * 0.05
    t = NVFP4_COMPRESSED_TENSORS.checkpoint_tensors("p.weight_packed", w)
    sd = {k.removeprefix("p."): v for k, v in t.items()}
    assert set(sd) == {"weight_packed", "weight_scale", "weight_global_scale"}
    ref = NVFP4PackedCompressor.decompress(sd, preset_name_to_scheme("NVFP4A16", ["Linear"]))["weight"]
    bank = NVFP4_COMPRESSED_TENSORS.bank_scale(sd["weight_scale"], sd["weight_global_scale"])
    ours = NVFP4_COMPRESSED_TENSORS.dequantize(sd["weight_packed"], bank, dtype)
    # the bank multiplies by 1/global (rounded once in float32) where the reference divides: within an ulp
    torch.testing.assert_close(ours.to(ref.dtype), ref, rtol=2**-7, atol=0)
    assert float((ours.float() - w).abs().max() / w.abs().max()) < 0.2


def test_nvfp4_modelopt_round_trip() -> None:
    g = torch.Generator().manual_seed(2)
    w = torch.randn(2, 16, 64, generator=g) * 0.02
    t = NVFP4.checkpoint_tensors("m.weight", w)
    assert t["m.weight_scale_2"].shape == (2, 1) and t["m.weight_scale"].dtype == torch.float8_e4m3fn
    # by the spec: e2m1 * weight_scale * weight_scale_2 (the two scales multiplied first, as the kernels do)
    s = t["m.weight_scale"].float() * t["m.weight_scale_2"][:, None]
    by_spec = (e2m1.decode(t["m.weight"]).reshape(2, 16, 4, 16) * s[..., None]).reshape(2, 16, 64)
    packed, bank = NVFP4.quantize(w)
    assert torch.equal(NVFP4.dequantize(packed, bank, torch.float32), by_spec)
    assert float((by_spec - w).abs().max() / w.abs().max()) < 0.2


def test_fp4_sizes() -> None:
    assert MXFP4.row_bytes(64, 128, 2) == 64 * 64 + 64 * 4  # packed bytes + one e8m0 byte per 32
    assert NVFP4.row_bytes(64, 128, 2) == 64 * 64 + 64 * (8 + 4)  # + one e4m3 byte per 16 + the row's multiplier
    with pytest.raises(QuantizationError, match="not whole mxfp4 groups of 32"):
        MXFP4.check_expert_shape(64, 48, "w")
    with pytest.raises(QuantizationError, match="nvfp4 experts need a multiple of 32"):
        NVFP4.check_expert_shape(64, 48, "w")


def test_fp4_configs_read() -> None:
    assert format_from_config({"quantization_config": {"quant_method": "mxfp4"}}) == MXFP4
    fmt = format_from_config({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                                      "group_size": 16}})  # fmt: skip
    assert fmt == NVFP4 and getattr(fmt, "layout", None) == "modelopt"
    ct = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
          "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16},
                                        "targets": ["Linear"]}}}  # fmt: skip
    fmt = format_from_config({"quantization_config": ct})
    assert fmt == NVFP4 and getattr(fmt, "layout", None) == "compressed-tensors"


@pytest.mark.parametrize(
    "qc, said",
    [
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "quant_algo 'FP8': only NVFP4"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "group_size 32: the format has 16"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"format": "nvfp4-pack-quantized", "weights": {"group_size": 32}}},
            },
            "nvfp4-pack-quantized with group_size 32 (group g): the format has 16",
        ),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"g": {"format": "float-quantized"}}},
            "format 'float-quantized' (group g): not supported yet",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"a": {"format": "nvfp4-pack-quantized"}, "b": {"format": "mxfp4-pack-quantized"}},
            },
            "several formats (mxfp4, nvfp4)",
        ),
    ],
)
def test_fp4_configs_refused(qc: dict, said: str) -> None:
    with pytest.raises(QuantizationError) as err:
        format_from_config({"quantization_config": qc})
    assert said in str(err.value)


def test_gpt_oss_blocks_read_packed(tmp_path) -> None:
    """gpt-oss's fused ``*_blocks`` / ``*_scales`` pass the header checks and read straight into bank rows
    ``[E, rows, cols / 2]`` with their e8m0 scales; dequantised, they equal transformers' conversion."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from freetoken.checkpoint.quantization import check_supported
    from freetoken.checkpoint.safetensors_io import SafetensorsReader
    from freetoken.checkpoint.weights import CheckpointWeights

    E, rows, cols = 3, 64, 96
    name = "model.layers.0.mlp.experts.gate_up_proj_blocks"
    t = MXFP4.checkpoint_tensors(name, torch.randn(E, rows, cols, generator=torch.Generator().manual_seed(4)))
    save_file(t, tmp_path / "model.safetensors")
    reader = SafetensorsReader(tmp_path)
    check_supported({"quantization_config": {"quant_method": "mxfp4"}}, reader, (), MXFP4)
    w = CheckpointWeights(reader, torch.device("cpu"), torch.float32, MXFP4)
    bank = torch.empty(E, rows, cols // 2, dtype=torch.uint8)
    scales = torch.empty(E, *MXFP4.scale_shape(rows, cols), dtype=torch.uint8)
    w.read_packed_into(name, bank, scales, (E, rows, cols))
    ref = convert_moe_packed_tensors(t[name], t[name[: -len("_blocks")] + "_scales"], dtype=torch.float32)
    assert torch.equal(MXFP4.dequantize(bank, scales, torch.float32), ref.transpose(1, 2))
    bad = {**t, name[: -len("_blocks")] + "_scales": t[name[: -len("_blocks")] + "_scales"][:, :, :2].contiguous()}
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(Exception, match="gate_up_proj_scales has shape \\[3, 64, 2\\].*needs \\[3, 64, 3\\]"):
        check_supported({"quantization_config": {"quant_method": "mxfp4"}}, SafetensorsReader(tmp_path), (), MXFP4)
