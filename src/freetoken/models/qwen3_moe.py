"""Qwen3-MoE: GQA with per-head q/k RMSNorm, softmax top-k router, optional top-k renormalisation."""

from freetoken.models.base import Family

FAMILY = Family(architectures=("Qwen3MoeForCausalLM",), qk_norm="head")
