"""Qwen3-Next: gated DeltaNet layers (q/k/v/z and b/a fused per key head) interleaved with gated full attention,
``(1+w)`` RMSNorms, partial rotary, routed experts plus a shared expert behind a sigmoid gate. The multi-token
prediction head (``mtp.*``) is not used."""

from freetoken.models.base import QWEN_ANCHOR_ENDS, QWEN_ANCHOR_STARTS, Family, Naming

FAMILY = Family(
    architectures=("Qwen3NextForCausalLM",),
    naming=Naming(shared_expert="shared_expert.", shared_expert_gate="shared_expert_gate.weight"),
    qk_norm="head",
    skippable=("*.rotary_emb.inv_freq", "mtp.*"),
    norm_offset=1.0,
    attn_output_gate=True,
    deltanet_proj="qkvz",
    anchor_starts=QWEN_ANCHOR_STARTS,
    anchor_ends=QWEN_ANCHOR_ENDS,
)
