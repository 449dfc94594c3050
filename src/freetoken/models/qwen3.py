"""Qwen3 (dense): GQA with per-head q/k RMSNorm."""

from freetoken.models.base import Family

FAMILY = Family(architectures=("Qwen3ForCausalLM",), qk_norm="head")
