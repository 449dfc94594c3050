"""Qwen3.5/3.6-MoE: Qwen3-Next's layers with separate q/k/v, z, b and a projections in the DeltaNet layers, every
layer MoE, top-k weights always renormalised. The text part of ``Qwen3_5MoeForConditionalGeneration`` lives under
``model.language_model.``; its vision tower (``model.visual.*``) and the multi-token prediction head (``mtp.*``) are
not used (text-only positions make its multimodal rotary the plain partial rotary)."""

from dataclasses import replace

from freetoken.models.base import QWEN_ANCHOR_ENDS, QWEN_ANCHOR_STARTS, Family, Naming

FAMILY = Family(
    architectures=("Qwen3_5MoeForCausalLM",),
    naming=Naming(shared_expert="shared_expert.", shared_expert_gate="shared_expert_gate.weight"),
    qk_norm="head",
    always_norm_topk=True,
    skippable=("*.rotary_emb.inv_freq", "mtp.*", "model.visual.*"),
    norm_offset=1.0,
    attn_output_gate=True,
    deltanet_proj="split",
    anchor_starts=QWEN_ANCHOR_STARTS,
    anchor_ends=QWEN_ANCHOR_ENDS,
)

VL_FAMILY = replace(
    FAMILY,
    architectures=("Qwen3_5MoeForConditionalGeneration",),
    naming=replace(
        FAMILY.naming,
        embed="model.language_model.embed_tokens.weight",
        final_norm="model.language_model.norm.weight",
        layer="model.language_model.layers.{i}.",
    ),
)
