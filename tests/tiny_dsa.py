"""Tiny random checkpoints of the DSA families (DeepSeek-V3.2, GLM-5; ``layers/dsa.py``) for tests: MLA's tiny shapes
(``tiny_mla.py``) with a lightning indexer of 8 heads whose ``index_topk`` (6) is shorter than most test contexts, so
the selection drops positions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from freetoken.bench.tiny_hybrid import randomize
from tiny_mla import MLA

INDEXER: dict[str, Any] = dict(index_topk=6, index_n_heads=8, index_head_dim=24)
VARIANTS = ["deepseek_v32", "glm_moe_dsa"]


def make_config(variant: str, **over: Any) -> Any:
    import transformers as tf

    cls = {"deepseek_v32": tf.DeepseekV32Config, "glm_moe_dsa": tf.GlmMoeDsaConfig}[variant]
    kw: dict[str, Any] = {**MLA, **INDEXER, "q_lora_rank": 48, "first_k_dense_replace": 1, "n_group": 2,
                          "topk_group": 1, "routed_scaling_factor": 2.5, **over}  # fmt: skip
    return cls(**kw)


def make_model(variant: str, seed: int, **over: Any) -> Any:
    import transformers as tf

    torch.manual_seed(seed)
    model = randomize(tf.AutoModelForCausalLM.from_config(make_config(variant, **over), dtype=torch.float32), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return model


def save_dsa_checkpoint(variant: str, directory: Path, seed: int, **over: Any) -> Any:
    model = make_model(variant, seed, **over)
    model.save_pretrained(directory)
    return model
