"""Write a synthetic Qwen3-MoE checkpoint of a chosen size to disk, shard by shard (bounded memory)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_qwen3_moe(
    directory: Path,
    num_layers: int = 4,
    hidden: int = 1024,
    num_experts: int = 64,
    moe_inter: int = 512,
    vocab: int = 4096,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    heads: int = 16,
    kv_heads: int = 4,
    hd: int = 64,
    top_k: int = 8,
    max_positions: int = 4096,
    shared_experts: bool = False,
) -> int:
    """One shard per layer; returns the total weight bytes written. ``shared_experts``: every expert of a
    layer gets the same random values (speed does not depend on them; writing is then disk-bound)."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": vocab,
        "hidden_size": hidden, "num_hidden_layers": num_layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hd, "intermediate_size": 4 * hidden,
        "moe_intermediate_size": moe_inter, "num_experts": num_experts, "num_experts_per_tok": top_k,
        "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": max_positions,
        "tie_word_embeddings": False, "dtype": str(dtype).removeprefix("torch."),
    }
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * 0.02).to(dtype)

    weight_map: dict[str, str] = {}
    total = 0

    def flush(tensors: dict[str, torch.Tensor], name: str) -> None:
        nonlocal total
        save_file(tensors, str(directory / name))
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()

    flush({"model.embed_tokens.weight": rnd(vocab, hidden), "lm_head.weight": rnd(vocab, hidden),
           "model.norm.weight": torch.ones(hidden, dtype=dtype)}, "model-embed.safetensors")
    for i in range(num_layers):
        p = f"model.layers.{i}."
        t = {
            p + "input_layernorm.weight": torch.ones(hidden, dtype=dtype),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype),
            p + "self_attn.q_proj.weight": rnd(heads * hd, hidden),
            p + "self_attn.k_proj.weight": rnd(kv_heads * hd, hidden),
            p + "self_attn.v_proj.weight": rnd(kv_heads * hd, hidden),
            p + "self_attn.o_proj.weight": rnd(hidden, heads * hd),
            p + "self_attn.q_norm.weight": torch.ones(hd, dtype=dtype),
            p + "self_attn.k_norm.weight": torch.ones(hd, dtype=dtype),
            p + "mlp.gate.weight": rnd(num_experts, hidden),
        }
        one = (rnd(moe_inter, hidden), rnd(moe_inter, hidden), rnd(hidden, moe_inter)) if shared_experts else None
        for e in range(num_experts):
            gate, up, down = one or (rnd(moe_inter, hidden), rnd(moe_inter, hidden), rnd(hidden, moe_inter))
            t[p + f"mlp.experts.{e}.gate_proj.weight"] = gate.clone()
            t[p + f"mlp.experts.{e}.up_proj.weight"] = up.clone()
            t[p + f"mlp.experts.{e}.down_proj.weight"] = down.clone()
        flush(t, f"model-layer{i:03d}.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total
