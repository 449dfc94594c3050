"""The hybrid parts of a synthetic Qwen3.5-MoE checkpoint (``synthetic_checkpoint.write_qwen3_moe(hybrid=...)``):
its config fields and each layer's token mixer (gated DeltaNet or gated attention) and shared expert."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from freetoken.bench.presets import HybridShape

Rnd = Callable[..., torch.Tensor]


def hybrid_config(h: HybridShape, num_layers: int) -> dict[str, Any]:
    kinds = ["full_attention" if (i + 1) % h.interval == 0 else "linear_attention" for i in range(num_layers)]
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "num_attention_heads": h.heads,
        "num_key_value_heads": h.kv_heads, "head_dim": h.head_dim, "layer_types": kinds,
        "linear_num_key_heads": h.linear_k_heads, "linear_num_value_heads": h.linear_v_heads,
        "linear_key_head_dim": h.linear_k_dim, "linear_value_head_dim": h.linear_v_dim,
        "linear_conv_kernel_dim": h.conv_kernel, "shared_expert_intermediate_size": h.shared_inter,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": h.partial_rotary},
    }  # fmt: skip


def layer_tensors(h: HybridShape, p: str, i: int, hidden: int, rnd: Rnd, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Layer i's mixer and shared expert (prefix ``p``); norm weights are 0 (the norms scale by 1 + w)."""
    t: dict[str, torch.Tensor] = {}
    if (i + 1) % h.interval == 0:
        a, hd = p + "self_attn.", h.head_dim
        t |= {a + "q_proj.weight": rnd(2 * h.heads * hd, hidden), a + "k_proj.weight": rnd(h.kv_heads * hd, hidden),
              a + "v_proj.weight": rnd(h.kv_heads * hd, hidden), a + "o_proj.weight": rnd(hidden, h.heads * hd),
              a + "q_norm.weight": torch.zeros(hd, dtype=dtype), a + "k_norm.weight": torch.zeros(hd, dtype=dtype)}
    else:
        la = p + "linear_attn."
        kd, vd, nv = h.linear_k_heads * h.linear_k_dim, h.linear_v_heads * h.linear_v_dim, h.linear_v_heads
        t |= {la + "in_proj_qkv.weight": rnd(2 * kd + vd, hidden), la + "in_proj_z.weight": rnd(vd, hidden),
              la + "in_proj_b.weight": rnd(nv, hidden), la + "in_proj_a.weight": rnd(nv, hidden),
              la + "conv1d.weight": rnd(2 * kd + vd, 1, h.conv_kernel), la + "dt_bias": torch.ones(nv, dtype=dtype),
              la + "A_log": torch.zeros(nv, dtype=dtype), la + "norm.weight": torch.ones(h.linear_v_dim, dtype=dtype),
              la + "out_proj.weight": rnd(hidden, vd)}
    s = p + "mlp.shared_expert."
    t |= {s + "gate_proj.weight": rnd(h.shared_inter, hidden), s + "up_proj.weight": rnd(h.shared_inter, hidden),
          s + "down_proj.weight": rnd(hidden, h.shared_inter), p + "mlp.shared_expert_gate.weight": rnd(1, hidden)}
    return t
