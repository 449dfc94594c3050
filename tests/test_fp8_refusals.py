"""A fake FP8-block checkpoint that does not fit its declared format fails at load, before the experts are read,
naming the tensor and both shapes: a scale tensor of the wrong shape, a missing one, one beside an unpacked
weight, routed experts that mix formats."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from checkpoint_edits import edited_checkpoint
from freetoken.checkpoint.errors import CheckpointError
from freetoken.config import EngineConfig
from freetoken.loader.model_setup import setup_model
from tiny_models import save_fp8_checkpoint

EXPERT = "model.layers.0.mlp.experts.3.up_proj.weight"


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fp8")
    save_fp8_checkpoint(d, seed=1)
    return d


def _edited(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> Path:
    return edited_checkpoint(src, dst, edit=edit)


def _refusal(d: Path) -> str:
    with pytest.raises(CheckpointError) as err:
        setup_model(EngineConfig(model=str(d), device="cpu", moe_backend="cpu"))
    return str(err.value)


@pytest.mark.parametrize("name", [EXPERT, "model.layers.2.self_attn.q_proj.weight"])
def test_a_scale_tensor_of_the_wrong_shape(fp8: Path, tmp_path: Path, name: str) -> None:
    d = _edited(fp8, tmp_path / "bad", lambda s: s.__setitem__(name + "_scale_inv", torch.ones(2, 1)))
    assert _refusal(d) == (f"{d}: scale tensor {name}_scale_inv has shape [2, 1], but {name} of shape [128, 128] in "
                           "fp8_block needs [1, 1]")  # fmt: skip


def test_a_missing_scale_tensor(fp8: Path, tmp_path: Path) -> None:
    d = _edited(fp8, tmp_path / "gone", lambda s: s.pop(EXPERT + "_scale_inv"))
    said = f"{d}: tensor {EXPERT} is packed (fp8_block) but its scale tensor {EXPERT}_scale_inv is missing"
    assert _refusal(d) == said


def test_a_scale_tensor_beside_an_unpacked_weight(fp8: Path, tmp_path: Path) -> None:
    name = "model.layers.0.self_attn.k_proj.weight"  # [64, 128]: left in float
    d = _edited(fp8, tmp_path / "stray", lambda s: s.__setitem__(name + "_scale_inv", torch.ones(1, 1)))
    assert _refusal(d) == f"{d}: scale tensor {name}_scale_inv sits beside a weight that is not packed"


def test_experts_that_mix_formats(fp8: Path, tmp_path: Path) -> None:
    def unpack(s: dict[str, torch.Tensor]) -> None:
        s[EXPERT] = s[EXPERT].float() * s.pop(EXPERT + "_scale_inv")

    d = _edited(fp8, tmp_path / "mixed", unpack)
    assert _refusal(d) == (f"{d}: routed experts mix formats: model.layers.0.mlp.experts.0.gate_proj.weight is "
                           f"fp8_block, {EXPERT} is not")  # fmt: skip


def test_fp8_bf16_scales_load(fp8: Path, tmp_path: Path) -> None:
    """Some releases ship their scales in bf16: read as float32."""

    def to_bf16(s: dict[str, torch.Tensor]) -> None:
        for k in [k for k in s if k.endswith("_scale_inv")]:
            s[k] = s[k].to(torch.bfloat16)

    d = _edited(fp8, tmp_path / "bf16s", to_bf16)
    setup = setup_model(EngineConfig(model=str(d), device="cpu", moe_backend="cpu"))
    banks = setup.loaded.banks
    assert banks is not None and banks.gate_up_scale is not None and banks.gate_up_scale.dtype == torch.float32
    setup.loaded.backend.close()
