"""Latent attention's part of a synthetic frontier checkpoint (``bench/synthetic_frontier.py``; DeepSeek-V3/V3.2,
GLM-5: ``presets.MLAShape``): the config's MLA and indexer fields, one layer's attention tensors (the q LoRA, the
latent projections and norms, ``o_proj``, the indexer's where it has one) and their bytes as written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from freetoken.bench.presets import MLAShape

ARCH = {"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM",
        "glm_moe_dsa": "GlmMoeDsaForCausalLM"}  # fmt: skip


def mla_config(m: MLAShape) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "q_lora_rank": m.q_lora, "kv_lora_rank": m.kv_lora, "qk_rope_head_dim": m.rope_dim,
        "qk_nope_head_dim": m.nope_dim, "v_head_dim": m.v_dim, "head_dim": m.rope_dim,
    }  # fmt: skip
    if m.index_heads:
        cfg |= {"index_topk": m.index_topk, "index_n_heads": m.index_heads, "index_head_dim": m.index_dim}
    return cfg


def _shapes(m: MLAShape, D: int, H: int) -> dict[str, tuple[int, ...]]:
    """Attention tensor name (after ``self_attn.``) -> shape; 1-D ones are norms (ones) or a bias (zeros)."""
    t: dict[str, tuple[int, ...]] = {
        "q_a_proj.weight": (m.q_lora, D), "q_a_layernorm.weight": (m.q_lora,),
        "q_b_proj.weight": (H * (m.nope_dim + m.rope_dim), m.q_lora),
        "kv_a_proj_with_mqa.weight": (m.kv_lora + m.rope_dim, D), "kv_a_layernorm.weight": (m.kv_lora,),
        "kv_b_proj.weight": (H * (m.nope_dim + m.v_dim), m.kv_lora), "o_proj.weight": (D, H * m.v_dim),
    }  # fmt: skip
    if m.index_heads:
        t |= {"indexer.wq_b.weight": (m.index_heads * m.index_dim, m.q_lora), "indexer.wk.weight": (m.index_dim, D),
              "indexer.k_norm.weight": (m.index_dim,), "indexer.k_norm.bias": (m.index_dim,),
              "indexer.weights_proj.weight": (m.index_heads, D)}  # fmt: skip
    return t


def mla_tensors(
    prefix: str, m: MLAShape, D: int, H: int, rnd: Callable[..., torch.Tensor], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in _shapes(m, D, H).items():
        if len(shape) == 2:
            out[prefix + name] = rnd(*shape)
        else:
            out[prefix + name] = (torch.zeros if name.endswith("bias") else torch.ones)(shape, dtype=dtype)
    return out


def mla_bytes(m: MLAShape, D: int, H: int, proj: Callable[[int, int], int]) -> int:
    """One layer's attention bytes as ``mla_tensors`` writes them (``proj``: a ``*proj.weight``'s bytes as packed;
    the indexer's ``wq_b`` and ``wk`` stay bf16, as ``synthetic_frontier``'s packing leaves them)."""
    return sum(proj(*s) if n.endswith("proj.weight") else s[0] * (s[1] if len(s) == 2 else 1) * 2
               for n, s in _shapes(m, D, H).items())  # fmt: skip
