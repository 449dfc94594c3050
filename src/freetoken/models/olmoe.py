"""OLMoE: q/k RMSNorm over the whole projection, optional q/k/v clamp, no top-k renormalisation by default."""

from freetoken.models.base import Family

FAMILY = Family(architectures=("OlmoeForCausalLM",), qk_norm="full", clip_qkv_key="clip_qkv")
