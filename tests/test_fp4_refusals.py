"""Fake FP4 checkpoints that do not fit their declared format fail at load, before the experts are read, naming
the tensor: scales of the wrong shape (a block size the format does not have among them) or dtype, a missing
per-tensor scale, a declared group size the format does not have, routed experts that mix formats."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from checkpoint_edits import edited_checkpoint
from fp4_checkpoints import save_fp4_checkpoint
from freetoken.checkpoint.errors import CheckpointError
from freetoken.config import EngineConfig
from freetoken.loader.model_setup import setup_model
from freetoken.quant import MXFP4, NVFP4

EXPERT = "model.layers.0.mlp.experts.3.up_proj.weight"  # [32, 64]: packed [32, 32]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for layout in ("nvfp4", "mxfp4-ct"):
        out[layout] = tmp_path_factory.mktemp(layout)
        save_fp4_checkpoint(out[layout], layout, seed=1)
    return out


def _edited(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> Path:
    return edited_checkpoint(src, dst, edit=edit)


def _refusal(d: Path) -> str:
    with pytest.raises(CheckpointError) as err:
        setup_model(EngineConfig(model=str(d), device="cpu", moe_backend="cpu"))
    return str(err.value)


def test_nvfp4_scales_per_32_are_a_block_size_nvfp4_does_not_have(ckpts: dict[str, Path], tmp_path: Path) -> None:
    def per32(s: dict[str, torch.Tensor]) -> None:
        s[EXPERT + "_scale"] = s[EXPERT + "_scale"][:, ::2].contiguous()

    d = _edited(ckpts["nvfp4"], tmp_path / "g32", per32)
    assert _refusal(d) == (f"{d}: scale tensor {EXPERT}_scale has shape [32, 2], but {EXPERT} of shape [32, 32] in "
                           "nvfp4 needs [32, 4]")  # fmt: skip


def test_mxfp4_scales_of_the_wrong_shape(ckpts: dict[str, Path], tmp_path: Path) -> None:
    name = EXPERT + "_packed"
    d = _edited(
        ckpts["mxfp4-ct"],
        tmp_path / "bad",
        lambda s: s.__setitem__(EXPERT[:-6] + "weight_scale", torch.zeros(32, 4, dtype=torch.uint8)),
    )
    assert _refusal(d) == (f"{d}: scale tensor {EXPERT}_scale has shape [32, 4], but {name} of shape [32, 32] in "
                           "mxfp4 needs [32, 2]")  # fmt: skip


@pytest.mark.parametrize("layout, dtype, said", [
    ("nvfp4", torch.float32, "float32, nvfp4 scales are float8_e4m3fn"),
    ("nvfp4", torch.uint8, "uint8, nvfp4 scales are float8_e4m3fn"),  # e8m0 bytes in an NVFP4 checkpoint
    ("mxfp4-ct", torch.float8_e4m3fn, None),  # a dtype no part of an MXFP4 checkpoint has: the dtype check says so
])  # fmt: skip
def test_scales_of_the_wrong_dtype(
    ckpts: dict[str, Path], tmp_path: Path, layout: str, dtype, said: str | None
) -> None:
    key = EXPERT + "_scale"

    def retype(s: dict[str, torch.Tensor]) -> None:
        s[key] = s[key].view(torch.uint8).to(dtype) if dtype != torch.uint8 else s[key].view(torch.uint8)

    d = _edited(ckpts[layout], tmp_path / "dt", retype)
    if said is None:
        assert _refusal(d).startswith(f"{d}: 1 tensor(s) in float8_e4m3fn, e.g. {key}")
    else:
        assert _refusal(d) == f"{d}: scale tensor {key} has dtype {said}"


def test_a_missing_per_tensor_scale(ckpts: dict[str, Path], tmp_path: Path) -> None:
    d = _edited(ckpts["nvfp4"], tmp_path / "gone", lambda s: s.pop(EXPERT + "_scale_2"))
    assert _refusal(d) == f"{d}: tensor {EXPERT} is packed (nvfp4) but its per-tensor scale {EXPERT}_scale_2 is missing"


def test_experts_that_mix_formats(ckpts: dict[str, Path], tmp_path: Path) -> None:
    def unpack(s: dict[str, torch.Tensor]) -> None:  # one expert's up_proj stored in float, its scales gone
        bank = NVFP4.bank_scale(s.pop(EXPERT + "_scale"), s.pop(EXPERT + "_scale_2"))
        s[EXPERT] = NVFP4.dequantize(s[EXPERT], bank, torch.float32)

    d = _edited(ckpts["nvfp4"], tmp_path / "mixed", unpack)
    assert _refusal(d) == (f"{d}: routed experts mix formats: model.layers.0.mlp.experts.0.gate_proj.weight is "
                           f"nvfp4, {EXPERT} is not")  # fmt: skip


def test_a_group_size_the_format_does_not_have(ckpts: dict[str, Path], tmp_path: Path) -> None:
    d = _edited(ckpts["mxfp4-ct"], tmp_path / "cfg", lambda s: None)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16
    (d / "config.json").write_text(json.dumps(cfg))
    assert _refusal(d) == (f"{d}: uses compressed-tensors mxfp4-pack-quantized with group_size 16 (group group_0): "
                           "the format has 32")  # fmt: skip


def test_the_formats_load_as_written(ckpts: dict[str, Path]) -> None:
    """The unedited checkpoints load (the refusals above are the edits')."""
    for layout, fmt in (("nvfp4", NVFP4), ("mxfp4-ct", MXFP4)):
        setup = setup_model(EngineConfig(model=str(ckpts[layout]), device="cpu", moe_backend="cpu"))
        assert setup.loaded.banks is not None and setup.loaded.banks.fmt == fmt
        setup.loaded.backend.close()
