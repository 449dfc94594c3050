"""What the loader cannot read correctly it refuses with one line, before reading the experts: a quantisation it does
not implement (an unknown ``quant_method``, an fp8 block size, experts of partial blocks), tensors of a dtype it does
not read, and tensors no part of the family reads. Tensors the family declares skippable load, said once. The fp8
checkpoints' own refusals (scale tensors of the wrong shape, missing, stray): tests/test_fp8_refusals.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.checkpoint.errors import CheckpointError
from freetoken.config import EngineConfig
from freetoken.loader.model_setup import setup_model
from subproc import child_env
from tiny_models import save_checkpoint

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plain")
    save_checkpoint("qwen3_moe", d, seed=3)
    assert (d / "model.safetensors").exists()  # one file: the tests below rewrite it
    return d


def _variant(src: Path, dst: Path, tensors=None, config=None) -> Path:
    """A copy of ``src`` whose tensors (name -> tensor) and config.json go through the given edits."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    state = load_file(src / "model.safetensors")
    save_file(tensors(state) if tensors else state, dst / "model.safetensors", metadata={"format": "pt"})
    if config:
        cfg = json.loads((src / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(config(cfg)))
    return dst


def _fp8(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every projection weight in float8_e4m3fn with a 128x128-block ``weight_scale_inv`` beside it, as the
    fp8 checkpoints of DeepSeek/Qwen ship them."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.endswith("proj.weight") and t.dim() == 2:
            out[name] = t.to(torch.float8_e4m3fn)
            blocks = (-(-t.shape[0] // 128), -(-t.shape[1] // 128))
            out[name + "_scale_inv"] = torch.ones(blocks, dtype=torch.float32)
        else:
            out[name] = t
    return out


def _with_fp8_config(cfg: dict) -> dict:
    return {**cfg, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                           "activation_scheme": "dynamic"}}  # fmt: skip


def _load(d: Path) -> None:
    setup_model(EngineConfig(model=str(d), device="cpu", moe_backend="fused"))


def test_an_unknown_quantization_is_refused_in_one_line(plain: Path, tmp_path: Path) -> None:
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    d = _variant(plain, tmp_path / "gptq", config=lambda c: {**c, "quantization_config": gptq})
    line = "uses quantization 'gptq' (4-bit, group 128): not supported yet"
    with pytest.raises(CheckpointError) as err:
        _load(d)
    assert str(err.value) == f"{d}: {line}"
    env = child_env()
    r = subprocess.run([sys.executable, "-m", "freetoken.cli", "generate", "--model", str(d), "--prompt", "x",
                        "--device", "cpu"], capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"ft generate: error: {d}: {line}"]


def test_an_fp8_block_size_not_implemented_is_refused(plain: Path, tmp_path: Path) -> None:
    cfg = {"quant_method": "fp8", "weight_block_size": [64, 64], "activation_scheme": "dynamic"}
    d = _variant(plain, tmp_path / "fp8b64", _fp8, lambda c: {**c, "quantization_config": cfg})
    with pytest.raises(CheckpointError) as err:
        _load(d)
    assert str(err.value) == f"{d}: uses fp8 with weight_block_size [64, 64]: only [128, 128] is implemented"


def test_fp8_experts_of_partial_blocks_are_refused(plain: Path, tmp_path: Path) -> None:
    """This family's experts are [32, 64]: not whole 128x128 blocks, which the kernels address."""
    d = _variant(plain, tmp_path / "fp8small", _fp8, _with_fp8_config)
    with pytest.raises(CheckpointError) as err:
        _load(d)
    assert str(err.value) == (f"{d}: routed expert weight model.layers.0.mlp.experts.0.gate_proj.weight [32, 64] is "
                              "not whole 128x128 fp8 blocks: routed experts of partial blocks are not implemented")


def test_fp8_weights_without_a_quantization_config_are_refused(plain: Path, tmp_path: Path) -> None:
    d = _variant(plain, tmp_path / "fp8bare", _fp8)
    with pytest.raises(CheckpointError) as err:
        _load(d)
    n = sum(1 for name in load_file(d / "model.safetensors") if name.endswith("proj.weight"))
    first = "model.layers.0.mlp.experts.0.down_proj.weight"
    assert str(err.value) == (f"{d}: {n} tensor(s) in float8_e4m3fn, e.g. {first}, and weight_scale_inv tensors "
                              "(quantised without a quantization_config?): not supported yet")  # fmt: skip


def test_a_tensor_no_one_reads_is_refused_by_name(plain: Path, tmp_path: Path) -> None:
    d = _variant(plain, tmp_path / "extra", lambda s: {**s, "model.layers.0.mlp.extra_proj.weight": torch.ones(4, 4)})
    with pytest.raises(CheckpointError) as err:
        _load(d)
    assert str(err.value) == (f"{d}: 1 tensor(s) Qwen3MoeForCausalLM does not read: "
                              "model.layers.0.mlp.extra_proj.weight: not supported yet")  # fmt: skip


def test_skippable_tensors_load_and_are_said_once(plain: Path, tmp_path: Path, caplog) -> None:
    extra = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(8) for i in range(3)}
    d = _variant(plain, tmp_path / "inv_freq", lambda s: {**s, **extra})
    with caplog.at_level(logging.INFO, logger="freetoken.checkpoint.weights"):
        _load(d)
    said = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(said) == 1 and "3 tensor(s)" in said[0] and "rotary_emb.inv_freq" in said[0]


def test_a_tied_head_saved_anyway_loads(plain: Path, tmp_path: Path) -> None:
    """With tie_word_embeddings the head is the embedding; a saved copy of it is not an unread weight."""
    d = _variant(plain, tmp_path / "tied", config=lambda c: {**c, "tie_word_embeddings": True})
    _load(d)
