"""Kimi-Linear (``KimiLinearForCausalLM``, moonshotai/Kimi-Linear-48B-A3B): Kimi Delta Attention layers
(``layers/kda.py``) beside NoPE multi-head latent attention layers (``layers/mla.py`` without rotary), which layers
are which from ``linear_attn_config`` (1-indexed ``full_attn_layers`` / ``kda_layers``) or ``layer_types``;
DeepSeek-V3's sigmoid routing (correction bias, group limits, renormalised, ``routed_scaling_factor``) over experts
stored as ``block_sparse_moe.experts.{e}.w1/w3/w2``, a shared expert, the first ``first_k_dense_replace`` layers (1
when unsaid) dense. Its config.json names fields its own way (``num_experts_per_token``, ``moe_renormalize``, …):
``checkpoint/config_aliases.py`` reads them into the usual names. Kimi's chat markup: ``chat/`` ``kimi_k2``."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("KimiLinearForCausalLM",),
    naming=Naming(
        moe="block_sparse_moe.",
        mlp_alt="block_sparse_moe.",  # dense layers: ``mlp.`` as shipped, ``block_sparse_moe.`` as transformers saves
        experts=("experts.{e}.w1.weight", "experts.{e}.w3.weight", "experts.{e}.w2.weight"),
        shared_expert="shared_experts.",
        linear_attn="self_attn.",
    ),
    attention="mla",
    mla_rope=False,
    routing="sigmoid",
    deltanet_proj="kda",
    mtp_keys=("num_nextn_predict_layers",),
    anchor_starts=("<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|tool_calls_section_begin|>", "<think>"),
    anchor_ends=("<|im_end|>", "<|tool_calls_section_end|>", "</think>"),
)
