"""What a bad DeepSeek-V3.2 / GLM-5 checkpoint gets at load (``models/dsa_blocks.py``, ``models/mla_blocks.py``): a
``CheckpointError`` naming the field or tensor - the latent rank or the query's head dims disagreeing with the
projections, an indexer tensor missing, ``index_topk`` below 1, a model without the q LoRA the indexer reads, GLM-5's
shared-indexer layers; GLM-5.3-Flash refused in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from checkpoint_edits import edited_checkpoint
from freetoken import LLM
from freetoken.checkpoint.errors import CheckpointError
from tiny_dsa import save_dsa_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("glm_moe_dsa")
    save_dsa_checkpoint("glm_moe_dsa", d, 0, num_hidden_layers=2)
    return d


def _edited(src: Path, dst: Path, config: Callable[[dict], None] | None = None, drop: str | None = None) -> Path:
    return edited_checkpoint(src, dst, config=config, drop=drop)


def _refused(d: Path, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        LLM(model=str(d), device="cpu", dtype="float32")


def test_latent_and_query_shapes_are_checked(ckpt, tmp_path):
    _refused(_edited(ckpt, tmp_path / "rank", config=lambda c: c.update(kv_lora_rank=24)),
             r"kv_a_proj_with_mqa.weight has 48 rows .*kv_lora_rank \+ qk_rope_head_dim")  # fmt: skip
    _refused(_edited(ckpt, tmp_path / "nope", config=lambda c: c.update(qk_nope_head_dim=8)),
             r"q_b_proj.weight has 128 rows .*qk_nope_head_dim \+ qk_rope_head_dim")  # fmt: skip


@pytest.mark.parametrize("tensor", ["wk.weight", "k_norm.bias", "weights_proj.weight", "wq_b.weight"])
def test_a_missing_indexer_tensor_is_named(ckpt, tmp_path, tensor):
    name = f"model.layers.1.self_attn.indexer.{tensor}"
    _refused(_edited(ckpt, tmp_path / "cut", drop=name), f"tensor {name} is missing")


@pytest.mark.parametrize("value", [0, -3, None, 2.5])
def test_index_topk_must_be_positive(ckpt, tmp_path, value):
    _refused(_edited(ckpt, tmp_path / "topk", config=lambda c: c.update(index_topk=value)), "index_topk")


def test_dsa_without_a_q_lora_and_bad_indexer_kinds_are_refused(ckpt, tmp_path):
    _refused(_edited(ckpt, tmp_path / "lora", config=lambda c: c.update(q_lora_rank=None)), "q_lora_rank")
    _refused(_edited(ckpt, tmp_path / "first", config=lambda c: c.update(indexer_types=["shared", "full"])),
             r"indexer_types\[0\] is 'shared'")  # fmt: skip
    _refused(_edited(ckpt, tmp_path / "kind", config=lambda c: c.update(indexer_types=["full", "half"])),
             r"indexer_types\[1\] is 'half'")  # fmt: skip
    _refused(_edited(ckpt, tmp_path / "short", config=lambda c: c.update(indexer_types=["full"])), "indexer_types")
    # a shared layer with indexer tensors of its own: they would be unused, and are refused naming one
    _refused(_edited(ckpt, tmp_path / "unused", config=lambda c: c.update(indexer_types=["full", "shared"])),
             r"model\.layers\.1\.self_attn\.indexer\.")  # fmt: skip


@pytest.mark.parametrize("raw,kinds", [
    ({"indexer_types": ["full", "shared", "full", "shared"]}, "FSFS"),
    ({"index_topk_pattern": "FFSS"}, "FFSS"),
    ({}, "FFFF"),  # transformers' defaults: every layer from layer 1 (offset 2), each one
    ({"index_topk_freq": 2}, "FFSF"),
    ({"index_topk_freq": 3, "index_skip_topk_offset": 1}, "FSSF"),
])  # fmt: skip
def test_indexer_kinds_follow_transformers(tmp_path, raw, kinds):
    """GLM-5's layers sharing an indexer, derived as ``GlmMoeDsaConfig`` does; DeepSeek-V3.2 ignores these keys."""
    from freetoken.checkpoint.hf_config import load_hf_config
    from freetoken.models.dsa_blocks import indexer_kinds
    from freetoken.models.registry import get_family

    for arch, want in (("GlmMoeDsaForCausalLM", kinds), ("DeepseekV32ForCausalLM", "FFFF")):
        cfg = {"architectures": [arch], "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
               "vocab_size": 100, **raw}  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        hf = load_hf_config(tmp_path)
        got = "".join(k[0].upper() for k in indexer_kinds(hf, get_family(arch)))
        assert got == want, (arch, raw)


def test_glm5_next_is_refused_in_one_line(ckpt, tmp_path):
    d = _edited(ckpt, tmp_path / "next", config=lambda c: c.update(architectures=["Glm5NextForConditionalGeneration"]))
    with pytest.raises(CheckpointError) as err:
        LLM(model=str(d), device="cpu", dtype="float32")
    assert "out of scope" in str(err.value) and "\n" not in str(err.value)
