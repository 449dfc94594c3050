"""What a model family declares: its weight names and its small architectural switches.

Families differ from each other by a handful of choices; the decoder in ``decoder.py`` composes the
layers, ``loader/model_build.py`` assembles a model from a checkpoint's weights by these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Naming:
    """Checkpoint tensor names; ``{i}`` = layer, ``{e}`` = expert."""

    embed: str = "model.embed_tokens.weight"
    final_norm: str = "model.norm.weight"
    lm_head: str = "lm_head.weight"
    layer: str = "model.layers.{i}."
    attn_norm: str = "input_layernorm.weight"
    ffn_norm: str = "post_attention_layernorm.weight"
    attn: str = "self_attn."
    q_norm: str = "q_norm.weight"
    k_norm: str = "k_norm.weight"
    mlp: str = "mlp."  # dense MLP prefix
    mlp_alt: str | None = None  # where the dense MLP may sit instead (Kimi-Linear as transformers saves it)
    moe: str = "mlp."  # MoE block prefix
    router: str = "gate.weight"
    router_bias: str = "gate.e_score_correction_bias"  # sigmoid routing's correction bias [E]
    experts: tuple[str, str, str] = (
        "experts.{e}.gate_proj.weight",
        "experts.{e}.up_proj.weight",
        "experts.{e}.down_proj.weight",
    )
    # transformers-5 in-memory layout, also found in some checkpoints: [E, 2I, D] and [E, D, I]
    fused_experts: tuple[str, str] = ("experts.gate_up_proj", "experts.down_proj")
    shared_expert: str | None = None
    shared_expert_gate: str | None = None
    linear_attn: str = "linear_attn."  # gated DeltaNet prefix (hybrid families)


@dataclass(frozen=True)
class Family:
    architectures: tuple[str, ...]
    naming: Naming = field(default_factory=Naming)
    qk_norm: str = "none"  # "none" | "head" (per head, [hd]) | "full" (whole projection, [H*hd])
    qk_norm_key: str | None = None  # config key that switches qk_norm on (GLM-4.5: "use_qk_norm"); None: always
    partial_rotary: float = 1.0  # the rotary share of a head when config.json names none (GLM-4.5: 0.5)
    always_norm_topk: bool = False  # Mixtral renormalises top-k weights regardless of config
    routing: str = "softmax"  # "softmax" (top-k of a softmax) | "sigmoid" (DeepSeek-V3 style: ``models/routing.py``)
    routing_groups: bool = True  # sigmoid routing reads n_group, topk_group, routed_scaling_factor (MiniMax-M2: no)
    attention: str = "gqa"  # "gqa" (``layers/attention.py``) | "mla": multi-head latent attention (``layers/mla.py``)
    # | "dsa": MLA with DeepSeek sparse attention's indexer (``layers/dsa.py``)
    mla_rope: bool = True  # False: MLA without any position encoding (Kimi-Linear's NoPE, ``mla_use_nope``)
    indexer_rope_interleave: bool = False  # DSA: the indexer's rotary in the interleaved layout (GLM-5)
    indexer_sharing: bool = False  # DSA: layers may reuse an earlier layer's top-k (GLM-5's ``indexer_types``)
    qkv_bias_key: str | None = None  # config key forcing q/k/v biases (Qwen2: "qkv_bias")
    clip_qkv_key: str | None = None  # config key of a q/k/v clamp (OLMoE: "clip_qkv")
    # Checkpoint tensors the family does not read (fnmatch patterns); any other unread tensor is refused.
    skippable: tuple[str, ...] = ("*.rotary_emb.inv_freq",)  # rotary tables older checkpoints saved
    # config keys counting multi-token-prediction layers stored after the decoder's (``model.layers.{N + j}``): skipped
    mtp_keys: tuple[str, ...] = ()
    # Hybrid families (gated DeltaNet + gated attention, ``layers/deltanet.py``):
    norm_offset: float = 0.0  # 1.0: RMSNorms scale by (1 + w) (the norms around layers, q/k norms, final norm)
    attn_output_gate: bool = False  # q_proj also yields a per-head sigmoid gate on the attention output
    deltanet_proj: str | None = None  # None: no linear-attention layers; "qkvz" (Qwen3-Next) | "split" (Qwen3.5)
    # | "kda": Kimi Delta Attention (``layers/kda.py``, ``models/kda_blocks.py``)
    full_attention_interval: int = 4  # layer_types when config.json gives none: every n-th layer full attention
    # gpt-oss: a learned logit per head in every softmax's denominator ("sinks"); a router bias; routed experts stored
    # transposed ([E, D, 2I], gate and up columns interleaved; [E, I, D]) with biases, under the clamped activation
    attn_sinks: bool = False
    router_bias: bool = False
    gpt_oss_experts: bool = False
    # The sliding-window layers (``layer_types``) keep only their window of KV: a ring per request in the state pool,
    # checkpointed at anchors like the recurrent states (``layers/window_attention.py``)
    window_ring: bool = False
    # A loader module whose ``build_model`` assembles this family instead of the generic one (Gemma-4, DeepSeek-V4);
    # its optional ``check_config(hf)`` refuses a bad config.json before any weight (``loader/hub_support.py``)
    build: str | None = None
    # Special tokens where agent harnesses edit the context (``cache/anchors.py``): opening and closing ones.
    anchor_starts: tuple[str, ...] = ()
    anchor_ends: tuple[str, ...] = ()


# ChatML with Qwen's thinking and tool markup
QWEN_ANCHOR_STARTS = ("<think>", "<tool_call>", "<tool_response>", "<|im_start|>")
QWEN_ANCHOR_ENDS = ("</think>", "</tool_call>", "</tool_response>", "<|im_end|>")


def skip_patterns(family: Family, raw: dict[str, object], num_layers: int) -> tuple[str, ...]:
    """The family's skippable patterns plus its multi-token-prediction layers (their count from ``mtp_keys``)."""
    mtp = next((v for k in family.mtp_keys if isinstance(v := raw.get(k), int) and not isinstance(v, bool)), 0)
    layer = family.naming.layer
    return family.skippable + tuple(layer.format(i=num_layers + j) + "*" for j in range(mtp))
