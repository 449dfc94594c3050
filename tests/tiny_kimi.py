"""A tiny random Kimi-Linear checkpoint (``KimiLinearForCausalLM``) for tests: 4 layers, KDA at 1, 3, 4 and NoPE latent
attention at 2 (1-indexed in ``linear_attn_config``, as the real checkpoints list them), the first layer dense,
8 experts in 2 groups (1 kept) top-2 with a shared expert; saved by transformers' ``save_pretrained`` (the names
the real checkpoints ship: ``block_sparse_moe.experts.{e}.w1``, ``q_conv1d``, ``A_log`` [1, 1, H, 1], …).

Weights are drawn wide (``bench/tiny_hybrid.randomize``); the forget gate's ``A_log`` small so the decays keep a
state over tens of tokens (the chunked rule's chunks and the checkpoints then carry real information); a random
correction bias so it changes choices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from freetoken.bench.tiny_hybrid import randomize

SHAPE: dict[str, Any] = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
    num_hidden_layers=4, num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
    kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24, n_group=2, topk_group=1,
    routed_scaling_factor=2.446, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    linear_attn_config={"full_attn_layers": [2], "kda_layers": [1, 3, 4], "head_dim": 16, "num_heads": 4,
                        "short_conv_kernel_size": 4},
    first_k_dense_replace=1, max_position_embeddings=512,
)  # fmt: skip


def make_model(seed: int, **overrides: Any) -> Any:
    """``overrides``: fields of ``SHAPE`` changed (e.g. ``vocab_size`` to fit a tokenizer)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.KimiLinearConfig(**{**SHAPE, **overrides})
    model = randomize(tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # decay rates exp(A_log) in [0.05, 0.5]
                p.copy_(torch.empty(p.shape).uniform_(0.05, 0.5, generator=g).log())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return model


def save_kimi_checkpoint(directory: Path, seed: int, **overrides: Any) -> Any:
    model = make_model(seed, **overrides)
    model.save_pretrained(directory)
    return model
