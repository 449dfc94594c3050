"""Llama (dense): GQA, optional attention bias, rope scaling variants."""

from freetoken.models.base import Family

FAMILY = Family(architectures=("LlamaForCausalLM",))
