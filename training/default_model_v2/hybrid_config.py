"""v2's architecture: a tiny Qwen3.5-MoE hybrid (gated DeltaNet : gated full attention = 3 : 1), every layer MoE
with a shared expert, 64k context, sized for a <= 30 MB bf16 checkpoint."""

from __future__ import annotations

from typing import Any

from transformers import Qwen3_5MoeTextConfig

MAX_POSITIONS = 65536
ARCH: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 8,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    # 128 as in Qwen3.5 (and fla's gated backward on Hopper with Triton < 3.7.1 is wrong at a key block of 64).
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 96,
    "shared_expert_intermediate_size": 128,
    "max_position_embeddings": MAX_POSITIONS,
    # Qwen3.5's partial rotary (a quarter of each head) with a large theta: positions up to 64k stay distinct.
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "router_aux_loss_coef": 0.01,
}
TOY_ARCH: dict[str, Any] = {**ARCH, "hidden_size": 64, "num_hidden_layers": 4,
                            "layer_types": ["linear_attention"] * 3 + ["full_attention"], "head_dim": 16,
                            "linear_key_head_dim": 16, "linear_value_head_dim": 16, "moe_intermediate_size": 32,
                            "shared_expert_intermediate_size": 32}


def build_config(vocab_size: int, eos_ids: list[int], pad_id: int, toy: bool = False) -> Qwen3_5MoeTextConfig:
    arch = TOY_ARCH if toy else ARCH
    cfg = Qwen3_5MoeTextConfig(vocab_size=vocab_size, eos_token_id=eos_ids, pad_token_id=pad_id,
                               bos_token_id=None, **arch)
    cfg.architectures = ["Qwen3_5MoeForCausalLM"]
    return cfg
