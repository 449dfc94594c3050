"""HF ``architectures`` name -> model family (lazy imports: one line per family)."""

from __future__ import annotations

import importlib

from freetoken.checkpoint.errors import CheckpointError
from freetoken.models.base import Family

# "module" (its FAMILY) or "module:NAME"
_FAMILIES: dict[str, str] = {
    "Qwen3NextForCausalLM": "freetoken.models.qwen3_next",
    "Qwen3_5MoeForCausalLM": "freetoken.models.qwen3_5_moe",
    "Qwen3_5MoeForConditionalGeneration": "freetoken.models.qwen3_5_moe:VL_FAMILY",
    "Qwen3MoeForCausalLM": "freetoken.models.qwen3_moe",
    "Qwen2MoeForCausalLM": "freetoken.models.qwen2_moe",
    "MixtralForCausalLM": "freetoken.models.mixtral",
    "Glm4MoeForCausalLM": "freetoken.models.glm4_moe",
    "MiniMaxM2ForCausalLM": "freetoken.models.minimax_m2",
    "OlmoeForCausalLM": "freetoken.models.olmoe",
    "Qwen3ForCausalLM": "freetoken.models.qwen3",
    "LlamaForCausalLM": "freetoken.models.llama",
    "DeepseekV3ForCausalLM": "freetoken.models.deepseek_v3",
    "KimiLinearForCausalLM": "freetoken.models.kimi_linear",
    "Glm4MoeLiteForCausalLM": "freetoken.models.glm4_moe_lite",
    "DeepseekV32ForCausalLM": "freetoken.models.deepseek_v32",
    "GlmMoeDsaForCausalLM": "freetoken.models.glm_moe_dsa",
    "GptOssForCausalLM": "freetoken.models.gpt_oss",
    "Gemma4ForCausalLM": "freetoken.models.gemma4",
    "Gemma4ForConditionalGeneration": "freetoken.models.gemma4:VL_FAMILY",
    "DeepseekV4ForCausalLM": "freetoken.models.deepseek_v4",
}

# Architectures refused with a reason of their own rather than the generic "unsupported"
_OUT_OF_SCOPE: dict[str, str] = {
    "Glm5NextForConditionalGeneration": "GLM-5.3-Flash (glm5_next) is out of scope for now",
}


def supported_architectures() -> list[str]:
    return sorted(_FAMILIES)


def get_family(architecture: str, where: str = "config.json") -> Family:
    module = _FAMILIES.get(architecture)
    if architecture in _OUT_OF_SCOPE:
        raise CheckpointError(f"{where}: architecture {architecture!r} is not supported: {_OUT_OF_SCOPE[architecture]}")
    if module is None:
        raise CheckpointError(
            f"{where}: unsupported architecture {architecture!r}; supported: {', '.join(supported_architectures())}"
        )
    path, _, name = module.partition(":")
    family: Family = getattr(importlib.import_module(path), name or "FAMILY")
    return family
