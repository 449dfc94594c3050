"""Qwen2-MoE: q/k/v biases, routed experts plus a shared expert behind a sigmoid gate."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("Qwen2MoeForCausalLM",),
    naming=Naming(shared_expert="shared_expert.", shared_expert_gate="shared_expert_gate.weight"),
    qkv_bias_key="qkv_bias",
)
