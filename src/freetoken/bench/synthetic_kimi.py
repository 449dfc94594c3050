"""Write a synthetic Kimi-Linear checkpoint (``KimiLinearForCausalLM``, ``models/kimi_linear.py``) at a preset's shape
(``presets.KimiLinearShape``), shard by shard, named as moonshotai/Kimi-Linear-48B-A3B-Instruct ships it: KDA layers
(``q/k/v_proj``, a depthwise conv each, the low-rank forget and output gates, ``A_log``, ``dt_bias``, ``b_proj``,
``o_norm``, ``o_proj``) and NoPE latent-attention layers (``q_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``,
``kv_b_proj``, ``o_proj``) where the real model has them (its 1-indexed ``full_attn_layers``, those within the layers
written), the first dense layer as ``mlp.``, then ``block_sparse_moe.``: the sigmoid router and its correction bias,
the shared expert, the routed experts ``experts.{e}.w1/w3/w2``. config.json in the release's own field names
(``num_experts_per_token``, ``moe_renormalize``, ``linear_attn_config``, ``model_max_length``, ...).

``same_experts``: every expert of a layer the same random values (speed does not depend on them, and writing stays
disk-bound), as ``synthetic_frontier.py`` writes them; tests draw each expert (routing then changes the output)
and the weights wider (``std``: logits far from ties)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from freetoken.bench.presets import KimiLinearShape, MoEShape
from freetoken.bench.synthetic_experts import expert_tensors


def kimi_config(s: MoEShape, k: KimiLinearShape, num_layers: int, max_positions: int) -> dict[str, Any]:
    """The release's config.json at ``num_layers`` (the real model's first layers: its MLA layers among them)."""
    full = [i for i in k.full_attn_layers if i <= num_layers]
    V = k.vocab
    bos, eos, pad = (163584, 163586, 163839) if V > 163839 else (1, 2, 0)  # the release's ids, where they fit
    return {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": V,
        "hidden_size": s.hidden, "intermediate_size": k.dense_inter, "num_hidden_layers": num_layers,
        "num_attention_heads": k.heads, "num_key_value_heads": k.heads, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False,
        "first_k_dense_replace": k.dense_layers, "moe_intermediate_size": s.inter, "moe_layer_freq": 1,
        "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "num_experts": s.experts,
        "num_experts_per_token": s.top_k, "num_shared_experts": k.shared_experts, "routed_scaling_factor": k.scale,
        "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1, "q_lora_rank": None,
        "kv_lora_rank": k.kv_lora, "qk_nope_head_dim": k.nope_dim, "qk_rope_head_dim": k.rope_dim,
        "v_head_dim": k.v_dim, "mla_use_nope": True, "num_nextn_predict_layers": 0,
        "linear_attn_config": {"full_attn_layers": full, "kda_layers": [i for i in range(1, num_layers + 1)
                                                                        if i not in full],
                               "head_dim": k.kda_head_dim, "num_heads": k.kda_heads,
                               "short_conv_kernel_size": k.conv_kernel},
        "model_max_length": max_positions, "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
        "use_cache": True, "dtype": "bfloat16",
    }  # fmt: skip


def _shapes(s: MoEShape, k: KimiLinearShape, kda: bool) -> dict[str, tuple[int, ...]]:
    """A layer's token mixer: tensor name (after ``self_attn.``) -> shape; 1-D ones are norms."""
    D = s.hidden
    if kda:
        H, d, K = k.kda_heads, k.kda_head_dim, k.conv_kernel
        HD = H * d
        return {"q_proj.weight": (HD, D), "k_proj.weight": (HD, D), "v_proj.weight": (HD, D),
                "q_conv1d.weight": (HD, 1, K), "k_conv1d.weight": (HD, 1, K), "v_conv1d.weight": (HD, 1, K),
                "f_a_proj.weight": (d, D), "f_b_proj.weight": (HD, d), "b_proj.weight": (H, D),
                "g_a_proj.weight": (d, D), "g_b_proj.weight": (HD, d), "o_norm.weight": (d,),
                "o_proj.weight": (D, HD)}  # fmt: skip
    H = k.heads
    return {"q_proj.weight": (H * (k.nope_dim + k.rope_dim), D),
            "kv_a_proj_with_mqa.weight": (k.kv_lora + k.rope_dim, D), "kv_a_layernorm.weight": (k.kv_lora,),
            "kv_b_proj.weight": (H * (k.nope_dim + k.v_dim), k.kv_lora), "o_proj.weight": (D, H * k.v_dim)}  # fmt: skip


def write_kimi(
    directory: Path, shape: MoEShape, num_layers: int, max_positions: int = 1048576, embed_std: float = 0.02,
    seed: int = 0, same_experts: bool = True, std: float = 0.02,
) -> int:  # fmt: skip
    """One shard per layer (its routed experts in a second); returns the total weight bytes written (bf16)."""
    k = shape.kimi
    assert k is not None, f"{shape.name} is not a Kimi-Linear preset"
    if shape.fmt.quantized:
        raise ValueError(f"Kimi-Linear ships bf16 experts; no checkpoint layout for {shape.fmt.name}")
    directory.mkdir(parents=True, exist_ok=True)
    cfg = kimi_config(shape, k, num_layers, max_positions)
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    full = set(cfg["linear_attn_config"]["full_attn_layers"])
    g = torch.Generator().manual_seed(seed)
    D, I, E, V, dt = shape.hidden, shape.inter, shape.experts, k.vocab, torch.bfloat16

    def rnd(*dims: int) -> torch.Tensor:
        return (torch.randn(dims, generator=g) * std).to(dt)

    weight_map: dict[str, str] = {}
    total = 0

    def flush(tensors: dict[str, torch.Tensor], file: str) -> None:
        nonlocal total
        save_file(tensors, str(directory / file))
        for name, v in tensors.items():
            weight_map[name], total = file, total + v.numel() * v.element_size()

    ones = lambda n: torch.ones(n, dtype=dt)  # noqa: E731
    flush({"model.embed_tokens.weight": (torch.randn((V, D), generator=g) * embed_std).to(dt),
           "model.norm.weight": ones(D), "lm_head.weight": rnd(V, D)}, "model-embed.safetensors")  # fmt: skip
    H, d = k.kda_heads, k.kda_head_dim
    for i in range(num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        t = {p + "input_layernorm.weight": ones(D), p + "post_attention_layernorm.weight": ones(D)}
        kda = i + 1 not in full
        for name, dims in _shapes(shape, k, kda).items():
            t[a + name] = ones(dims[0]) if len(dims) == 1 else rnd(*dims)
        if kda:  # decay rates exp(A_log) in [1, 16] (Mamba-2's initial range); A_log and dt_bias float32
            t[a + "A_log"] = torch.empty((1, 1, H, 1)).uniform_(1.0, 16.0, generator=g).log()
            t[a + "dt_bias"] = torch.randn(H * d, generator=g) * 0.1
        if i < k.dense_layers:
            t |= {p + "mlp.gate_proj.weight": rnd(k.dense_inter, D), p + "mlp.up_proj.weight": rnd(k.dense_inter, D),
                  p + "mlp.down_proj.weight": rnd(D, k.dense_inter)}  # fmt: skip
            flush(t, f"model-layer{i:03d}.safetensors")
            continue
        m = p + "block_sparse_moe."
        t |= {m + "gate.weight": rnd(E, D), m + "gate.e_score_correction_bias": torch.randn(E, generator=g) * 0.01}
        si = k.shared_experts * I
        t |= {m + "shared_experts.gate_proj.weight": rnd(si, D), m + "shared_experts.up_proj.weight": rnd(si, D),
              m + "shared_experts.down_proj.weight": rnd(D, si)}  # fmt: skip
        flush(t, f"model-layer{i:03d}.safetensors")
        def one_expert() -> dict[str, torch.Tensor]:
            return {f"{n}.weight": x for n, x in zip(("w1", "w3", "w2"), (rnd(I, D), rnd(I, D), rnd(D, I)))}

        experts = expert_tensors(E, one_expert, m + "experts.", same_experts)
        flush(experts, f"model-layer{i:03d}-experts.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def kimi_bytes(shape: MoEShape, num_layers: int) -> int:
    """The bytes ``write_kimi`` writes for ``shape`` at ``num_layers`` (the dense layer counted), from shapes alone."""
    k = shape.kimi
    assert k is not None, f"{shape.name} is not a Kimi-Linear preset"
    D, I, E = shape.hidden, shape.inter, shape.experts
    full = {i for i in k.full_attn_layers if i <= num_layers}
    total = (2 * k.vocab * D + D) * 2
    for i in range(num_layers):
        kda = i + 1 not in full
        total += 2 * D * 2 + sum(2 * math.prod(x) for x in _shapes(shape, k, kda).values())
        total += (k.kda_heads + k.kda_heads * k.kda_head_dim) * 4 if kda else 0  # A_log, dt_bias (float32)
        if i < k.dense_layers:
            total += 3 * k.dense_inter * D * 2
            continue
        total += E * D * 2 + E * 4 + 3 * k.shared_experts * I * D * 2 + E * 3 * I * D * 2
    return total

