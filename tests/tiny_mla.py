"""Tiny random checkpoints of the MLA families (DeepSeek-V3, GLM-4.7-Flash) for tests, and the near-tie rule for
their sigmoid routing: wide weights (``tiny_models``' std 0.2), a random correction bias so it changes choices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from freetoken.bench.tiny_hybrid import randomize

MLA: dict[str, Any] = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
    max_position_embeddings=512, tie_word_embeddings=False, num_hidden_layers=3, n_routed_experts=8,
    num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, kv_lora_rank=32, qk_rope_head_dim=16,
    qk_nope_head_dim=16, v_head_dim=24, norm_topk_prob=True,
)  # fmt: skip
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}  # fmt: skip
# deepseek_v3: q LoRA, 2 groups of 4 experts (1 kept), the first layer dense; glm4_moe_lite: a plain q_proj,
# GLM's mlp_layer_types; deepseek_yarn: YaRN with mscale != mscale_all_dim, the rotate-half rope layout, biases
VARIANTS = ["deepseek_v3", "glm4_moe_lite", "deepseek_yarn"]


def make_config(variant: str) -> Any:
    import transformers as tf

    if variant == "deepseek_v3":
        return tf.DeepseekV3Config(**MLA, q_lora_rank=48, first_k_dense_replace=1, n_group=2, topk_group=1,
                                   routed_scaling_factor=2.5)  # fmt: skip
    if variant == "glm4_moe_lite":
        return tf.Glm4MoeLiteConfig(**MLA, q_lora_rank=None, routed_scaling_factor=1.8)
    if variant == "deepseek_yarn":
        return tf.DeepseekV3Config(**MLA, q_lora_rank=40, first_k_dense_replace=1, n_group=1, topk_group=1,
                                   rope_parameters=dict(YARN), rope_interleave=False, attention_bias=True)  # fmt: skip
    raise ValueError(variant)


def make_model(variant: str, seed: int) -> Any:
    import transformers as tf

    torch.manual_seed(seed)
    model = randomize(tf.AutoModelForCausalLM.from_config(make_config(variant), dtype=torch.float32), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return model


def save_mla_checkpoint(variant: str, directory: Path, seed: int) -> Any:
    model = make_model(variant, seed)
    model.save_pretrained(directory)
    return model


@torch.no_grad()
def sigmoid_margin(model: Any, ids: list[int]) -> float:
    """The smallest routing gap (``reference.sigmoid_router_margin``) over every MoE layer for the sequence ``ids``."""
    from reference import sigmoid_router_margin, torch_ops

    cfg = model.config
    with torch_ops(model):
        out = model(torch.tensor([ids]), use_cache=False, output_router_logits=True)
    biases = [m.mlp.gate.e_score_correction_bias for m in model.model.layers if hasattr(m.mlp, "gate")]
    assert len(biases) == len(out.router_logits)
    return min(sigmoid_router_margin(rl, b, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group)
               for rl, b in zip(out.router_logits, biases))  # fmt: skip
