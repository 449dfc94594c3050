"""Tiny randomly initialised Gemma-4 checkpoints (transformers 5.23's ``Gemma4ForCausalLM`` and the text part of
``Gemma4ForConditionalGeneration``), weights drawn wide as in ``tiny_models.py``.

"moe": 8 layers at the default 5:1 pattern (sliding 0-4 and 6, full 5 and 7), window 8; the last 2 layers KV-shared
(6 reads layer 4's window, 7 reads layer 5's pages; their dense MLP twice as wide); full layers of their own head dim
(32) and one KV head, keys equal values there (``attention_k_eq_v``); per-layer input embeddings (P = 8); 8 experts
top-2 beside the dense MLP; logits soft-capped. "dense": the same without experts, KV sharing or k = v (4 layers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from freetoken.bench.tiny_hybrid import randomize

TEXT: dict[str, Any] = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    global_head_dim=32, sliding_window=8, hidden_size_per_layer_input=8, vocab_size_per_layer_input=512,
    max_position_embeddings=256, final_logit_softcapping=30.0, tie_word_embeddings=True,
)  # fmt: skip
KINDS = ["sliding_attention"] * 5 + ["full_attention", "sliding_attention", "full_attention"]
MOE: dict[str, Any] = dict(
    TEXT, num_hidden_layers=8, layer_types=KINDS, num_global_key_value_heads=1, attention_k_eq_v=True,
    num_kv_shared_layers=2, use_double_wide_mlp=True, enable_moe_block=True, num_experts=8, top_k_experts=2,
    moe_intermediate_size=32,
)  # fmt: skip
DENSE: dict[str, Any] = dict(TEXT, num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)
WINDOW = 8


def make_gemma4(kind: str = "moe", seed: int = 0, multimodal: bool = False) -> Any:
    import transformers as tf
    from transformers.models.gemma4.configuration_gemma4 import Gemma4AudioConfig, Gemma4VisionConfig

    text = tf.Gemma4TextConfig(**(MOE if kind == "moe" else DENSE))
    torch.manual_seed(seed)
    if multimodal:
        vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2, head_dim=16)  # fmt: skip
        audio = Gemma4AudioConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, output_proj_dims=32,
                                  subsampling_conv_channels=[8, 4])  # fmt: skip
        model = tf.Gemma4ForConditionalGeneration(tf.Gemma4Config(text_config=text, vision_config=vision,
                                                                  audio_config=audio)).float()  # fmt: skip
    else:
        model = tf.Gemma4ForCausalLM(text).float()
    model = randomize(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # layer scalars away from 1 (a buffer: randomize leaves it), per-expert scales positive,
        # router scales wide enough that the scores spread (the router divides by sqrt(D))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
        for name, p in model.named_parameters():
            if name.endswith("per_expert_scale"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith("router.scale"):
                p.copy_((torch.rand(p.shape, generator=g) + 0.5) * 8.0)
    return model


def save_gemma4(directory: Path, kind: str = "moe", seed: int = 0, multimodal: bool = False) -> Any:
    model = make_gemma4(kind, seed, multimodal)
    model.save_pretrained(directory)
    return model
