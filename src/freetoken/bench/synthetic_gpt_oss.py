"""Write a synthetic gpt-oss checkpoint (``GptOssForCausalLM``) at a preset's shape (``presets.GptOssShape``), shard
by shard: attention with q/k/v/o biases and a sink logit per head, sliding-window layers alternating with full ones
(yarn rope as shipped), the biased router, and the routed experts with their biases, in MXFP4 as OpenAI ships them
(``*_blocks`` [E, rows, cols/32, 16] and e8m0 ``*_scales`` [E, rows, cols/32], ``quant_method: mxfp4``) or in
bf16 (``gate_up_proj`` [E, D, 2I] interleaved, ``down_proj`` [E, I, D]).

The MXFP4 experts are random codes under one scale (2^-7: weights of std ~0.02, like the bf16 ones): speed does
not depend on their values, and no float expert is materialised or quantised (writing stays disk-bound).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from freetoken.bench.presets import GptOssShape, MoEShape
from freetoken.quant import BF16, WeightFormat

_SCALE = 127 - 7  # e8m0 byte of 2^-7: random e2m1 codes (rms ~2.9) at std ~0.02
_UNCONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def gpt_oss_config(s: MoEShape, g: GptOssShape, num_layers: int, vocab: int, max_positions: int) -> dict[str, Any]:
    """gpt-oss's config.json as shipped (``rope_scaling`` yarn 32x over 4096 positions, the clamp's constants)."""
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": vocab,
        "hidden_size": s.hidden, "intermediate_size": s.inter, "num_hidden_layers": num_layers,
        "num_attention_heads": g.heads, "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim,
        "num_local_experts": s.experts, "num_experts_per_tok": s.top_k, "experts_per_token": s.top_k,
        "sliding_window": g.window, "layer_types": ["sliding_attention", "full_attention"] * (num_layers // 2)
        + ["sliding_attention"] * (num_layers % 2), "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096},
        "max_position_embeddings": max_positions, "initial_context_length": 4096, "swiglu_limit": 7.0,
        "attention_bias": True, "tie_word_embeddings": False, "hidden_act": "silu", "dtype": "bfloat16",
    }  # fmt: skip


def write_gpt_oss(
    directory: Path, shape: MoEShape, num_layers: int, vocab: int | None = None, max_positions: int = 131072,
    embed_std: float = 0.02, fmt: WeightFormat = BF16, seed: int = 0,
) -> int:  # fmt: skip
    """One shard per layer; returns the total weight bytes written (``vocab``: the shape's, unless given)."""
    g = shape.gpt_oss
    assert g is not None, f"{shape.name} is not a gpt-oss preset"
    if fmt.quantized and fmt.name != "mxfp4":
        raise ValueError(f"gpt-oss ships MXFP4 experts; no checkpoint layout for {fmt.name}")
    directory.mkdir(parents=True, exist_ok=True)
    V = vocab or g.vocab
    cfg = gpt_oss_config(shape, g, num_layers, V, max_positions)
    if fmt.quantized:
        cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": _UNCONVERTED}
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    gen = torch.Generator().manual_seed(seed)
    D, I, E, dt = shape.hidden, shape.inter, shape.experts, torch.bfloat16
    Q, KV = g.heads * g.head_dim, g.kv_heads * g.head_dim

    def rnd(*dims: int) -> torch.Tensor:
        return (torch.randn(dims, generator=gen) * 0.02).to(dt)

    def experts(p: str) -> dict[str, torch.Tensor]:
        t = {p + "gate_up_proj_bias": rnd(E, 2 * I), p + "down_proj_bias": rnd(E, D)}
        if not fmt.quantized:
            return t | {p + "gate_up_proj": rnd(E, D, 2 * I), p + "down_proj": rnd(E, I, D)}
        for name, rows, cols in (("gate_up_proj", 2 * I, D), ("down_proj", D, I)):
            blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=gen, dtype=torch.uint8)
            t[p + name + "_blocks"] = blocks
            t[p + name + "_scales"] = torch.full((E, rows, cols // 32), _SCALE, dtype=torch.uint8)
        return t

    weight_map: dict[str, str] = {}
    total = 0

    def flush(tensors: dict[str, torch.Tensor], name: str) -> None:
        nonlocal total
        save_file(tensors, str(directory / name))
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()

    embed = (torch.randn((V, D), generator=gen) * embed_std).to(dt)
    ones = torch.ones(D, dtype=dt)
    flush({"model.embed_tokens.weight": embed, "lm_head.weight": rnd(V, D), "model.norm.weight": ones},
          "model-embed.safetensors")  # fmt: skip
    for i in range(num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        t = {p + "input_layernorm.weight": ones.clone(), p + "post_attention_layernorm.weight": ones.clone(),
             a + "q_proj.weight": rnd(Q, D), a + "q_proj.bias": rnd(Q), a + "k_proj.weight": rnd(KV, D),
             a + "k_proj.bias": rnd(KV), a + "v_proj.weight": rnd(KV, D), a + "v_proj.bias": rnd(KV),
             a + "o_proj.weight": rnd(D, Q), a + "o_proj.bias": rnd(D), a + "sinks": rnd(g.heads),
             p + "mlp.router.weight": rnd(E, D), p + "mlp.router.bias": rnd(E)}  # fmt: skip
        flush(t | experts(p + "mlp.experts."), f"model-layer{i:03d}.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total
