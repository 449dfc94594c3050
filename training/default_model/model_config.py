"""The default model's architecture: a tiny Qwen3-MoE sized for a <= 30 MB bf16 checkpoint."""

from __future__ import annotations

from typing import Any

from transformers import Qwen3MoeConfig

ARCH: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 128,
    "intermediate_size": 512,  # unused (every layer is MoE); kept small for readers that size buffers by it
    "norm_topk_prob": True,
    "max_position_embeddings": 2048,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "router_aux_loss_coef": 0.01,
}
TOY_ARCH: dict[str, Any] = {**ARCH, "hidden_size": 64, "num_hidden_layers": 2, "head_dim": 16,
                            "moe_intermediate_size": 32, "intermediate_size": 128}


def build_config(vocab_size: int, eos_ids: list[int], pad_id: int, toy: bool = False) -> Qwen3MoeConfig:
    arch = TOY_ARCH if toy else ARCH
    return Qwen3MoeConfig(vocab_size=vocab_size, eos_token_id=eos_ids, pad_token_id=pad_id, bos_token_id=None,
                          **arch)


def param_count(cfg: Qwen3MoeConfig) -> int:
    """Parameters of the config (embeddings + untied head + layers), for sizing against the budget."""
    h, v, layers = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    attn = h * hd * (2 * nq + 2 * nkv) + 2 * hd
    moe = cfg.num_experts * 3 * h * cfg.moe_intermediate_size + cfg.num_experts * h
    return 2 * v * h + h + layers * (attn + moe + 2 * h)
