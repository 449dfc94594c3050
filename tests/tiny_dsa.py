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
# glm_moe_dsa_shared: GLM-5 whose layer 1 attends by layer 0's top-k (index_topk_freq 2 from layer 1: F, S, F)
VARIANTS = ["deepseek_v32", "glm_moe_dsa", "glm_moe_dsa_shared"]
SHARED = {"index_topk_freq": 2, "index_skip_topk_offset": 1}


def make_config(variant: str, **over: Any) -> Any:
    import transformers as tf

    cls = {"deepseek_v32": tf.DeepseekV32Config, "glm_moe_dsa": tf.GlmMoeDsaConfig}[variant.removesuffix("_shared")]
    if variant.endswith("_shared"):
        over = {**SHARED, **over}
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


@torch.no_grad()
def index_margin(model: Any, ids: list[int]) -> float:
    """The smallest relative gap, over every indexer layer and query, between the last kept and the first dropped
    position's score (DESIGN §8's near-tie rule for the indexer's top-k; inf where no query drops a position).
    transformers' indexers end in ``index_scores.topk(k)`` over [B, S, T]: that call's input is recorded."""
    from reference import torch_ops

    k, n = model.config.index_topk, len(ids)
    seen: list[torch.Tensor] = []
    topk = torch.Tensor.topk

    def record(self: torch.Tensor, *args: Any, **kw: Any) -> Any:
        if self.dim() == 3 and self.shape[-2:] == (n, n):
            seen.append(self.detach().clone())
        return topk(self, *args, **kw)

    torch.Tensor.topk = record  # type: ignore[method-assign]
    try:
        with torch_ops(model):
            model(torch.tensor([ids]), use_cache=False)
    finally:
        torch.Tensor.topk = topk  # type: ignore[method-assign]
    assert seen, "no indexer top-k seen"
    margin = float("inf")
    for scores in seen:
        for row in scores[0, k:]:  # query positions k.. see more than k positions
            top = row[torch.isfinite(row) & (row > -1e30)].sort(descending=True).values
            gap = (top[k - 1] - top[k]) / max(1.0, float(top.abs().max()))
            margin = min(margin, float(gap))
    return margin
