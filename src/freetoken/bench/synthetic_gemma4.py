"""Write a synthetic Gemma-4 checkpoint (``Gemma4ForCausalLM``, ``models/gemma4.py``) at a preset's shape
(``presets.Gemma4Shape``), shard by shard, named as transformers 5.23 saves it: per layer the attention (``q/k/v_proj``,
no ``v_proj`` on full layers under ``attention_k_eq_v``; ``q_norm``, ``k_norm``; ``o_proj``), the dense GELU MLP, the
router (``router.proj``, ``router.scale``, ``router.per_expert_scale``) and the routed experts beside it
(``experts.gate_up_proj`` [E, 2I, D], ``experts.down_proj`` [E, D, I]), its seven norms and ``layer_scalar``.
config.json: the release's ``text_config`` as a text-only model (the release wraps it in
``Gemma4ForConditionalGeneration`` beside a vision tower the engine skips: the same tensors under
``model.language_model.``), the full layers' head dim and KV heads in ``per_layer_config`` as transformers saves it.

Gemma-4 multiplies its embeddings by sqrt(D): the table is written at ``embed_std / sqrt(D)`` so the scaled rows
have ``embed_std`` (the other presets' residual). The release ties the head to the embeddings; a random model so tied
predicts its input token back (its own row dominates the residual: a logit of ~14 against a spread of ~1 at the real
shape), so decoding repeats one token through the same experts. Unless ``tied``, the head is a table of its own
(``lm_head.weight``, ``tie_word_embeddings`` false): the same [V, D] bytes read per token. ``same_experts``: every
expert of a layer the same random values (one expert repeated: writing stays disk-bound); tests draw each expert, and
the weights wider (``std``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from freetoken.bench.presets import Gemma4Shape, MoEShape

SLIDING, FULL = "sliding_attention", "full_attention"
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
         "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2")  # fmt: skip


def layer_types(g: Gemma4Shape, num_layers: int) -> list[str]:
    """Every ``pattern``-th layer full, the last full (as transformers forces it)."""
    return [FULL if (i + 1) % g.pattern == 0 or i == num_layers - 1 else SLIDING for i in range(num_layers)]


def gemma4_config(
    s: MoEShape, g: Gemma4Shape, num_layers: int, max_positions: int, tied: bool = False
) -> dict[str, Any]:
    types = layer_types(g, num_layers)
    full = {"head_dim": g.global_head_dim, "num_key_value_heads": g.global_kv_heads}
    return {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": g.vocab,
        "hidden_size": s.hidden, "intermediate_size": g.dense_inter, "num_hidden_layers": num_layers,
        "num_attention_heads": g.heads, "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim,
        "global_head_dim": g.global_head_dim, "num_global_key_value_heads": g.global_kv_heads,
        "per_layer_config": {str(i): full for i, t in enumerate(types) if t == FULL},
        "attention_k_eq_v": g.k_eq_v, "sliding_window": g.window, "layer_types": types,
        "rope_parameters": {FULL: {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
                            SLIDING: {"rope_theta": 10000.0, "rope_type": "default"}},
        "enable_moe_block": True, "num_experts": s.experts, "top_k_experts": s.top_k, "moe_intermediate_size": s.inter,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": g.vocab, "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False, "final_logit_softcapping": g.softcap, "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6, "attention_bias": False, "tie_word_embeddings": tied,
        "max_position_embeddings": max_positions, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
        "use_cache": True, "dtype": "bfloat16",
    }  # fmt: skip


def _attention(s: MoEShape, g: Gemma4Shape, kind: str) -> dict[str, tuple[int, ...]]:
    """A layer's attention: tensor name (after ``self_attn.``) -> shape; 1-D ones are norms."""
    D, H = s.hidden, g.heads
    hd, kv = (g.global_head_dim, g.global_kv_heads) if kind == FULL else (g.head_dim, g.kv_heads)
    t = {"q_proj.weight": (H * hd, D), "k_proj.weight": (kv * hd, D), "v_proj.weight": (kv * hd, D),
         "o_proj.weight": (D, H * hd), "q_norm.weight": (hd,), "k_norm.weight": (hd,)}  # fmt: skip
    if kind == FULL and g.k_eq_v:
        del t["v_proj.weight"]
    return t


def write_gemma4(
    directory: Path, shape: MoEShape, num_layers: int, max_positions: int = 262144, embed_std: float = 0.02,
    seed: int = 0, same_experts: bool = True, std: float = 0.02, tied: bool = False,
) -> int:  # fmt: skip
    """One shard per layer; returns the total weight bytes written (bf16)."""
    g = shape.gemma4
    assert g is not None, f"{shape.name} is not a Gemma-4 preset"
    if shape.fmt.quantized:
        raise ValueError(f"Gemma-4 ships bf16 experts; no checkpoint layout for {shape.fmt.name}")
    directory.mkdir(parents=True, exist_ok=True)
    cfg = gemma4_config(shape, g, num_layers, max_positions, tied)
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    gen = torch.Generator().manual_seed(seed)
    D, I, E, dt = shape.hidden, shape.inter, shape.experts, torch.bfloat16

    def rnd(*dims: int) -> torch.Tensor:
        return (torch.randn(dims, generator=gen) * std).to(dt)

    weight_map: dict[str, str] = {}
    total = 0

    def flush(tensors: dict[str, torch.Tensor], file: str) -> None:
        nonlocal total
        save_file(tensors, str(directory / file))
        for name, v in tensors.items():
            weight_map[name], total = file, total + v.numel() * v.element_size()

    ones = lambda n: torch.ones(n, dtype=dt)  # noqa: E731
    embed = (torch.randn((g.vocab, D), generator=gen) * (embed_std / D**0.5)).to(dt)
    head = {} if tied else {"lm_head.weight": rnd(g.vocab, D)}
    flush({"model.embed_tokens.weight": embed, "model.norm.weight": ones(D)} | head, "model-embed.safetensors")
    for i, kind in enumerate(cfg["layer_types"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        t = {p + n + ".weight": ones(D) for n in NORMS} | {p + "layer_scalar": ones(1)}
        t |= {a + n: ones(dims[0]) if len(dims) == 1 else rnd(*dims) for n, dims in _attention(shape, g, kind).items()}
        t |= {p + "mlp.gate_proj.weight": rnd(g.dense_inter, D), p + "mlp.up_proj.weight": rnd(g.dense_inter, D),
              p + "mlp.down_proj.weight": rnd(D, g.dense_inter)}  # fmt: skip
        t |= {p + "router.proj.weight": rnd(E, D), p + "router.scale": ones(D), p + "router.per_expert_scale": ones(E)}
        if same_experts:  # one expert repeated
            t[p + "experts.gate_up_proj"] = rnd(1, 2 * I, D).expand(E, 2 * I, D).contiguous()
            t[p + "experts.down_proj"] = rnd(1, D, I).expand(E, D, I).contiguous()
        else:
            t |= {p + "experts.gate_up_proj": rnd(E, 2 * I, D), p + "experts.down_proj": rnd(E, D, I)}
        flush(t, f"model-layer{i:03d}.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def gemma4_bytes(shape: MoEShape, num_layers: int, tied: bool = False) -> int:
    """The bytes ``write_gemma4`` writes for ``shape`` at ``num_layers``, from shapes alone."""
    g = shape.gemma4
    assert g is not None, f"{shape.name} is not a Gemma-4 preset"
    D, I, E = shape.hidden, shape.inter, shape.experts
    total = ((1 if tied else 2) * g.vocab * D + D) * 2
    for kind in layer_types(g, num_layers):
        numel = sum(math.prod(x) for x in _attention(shape, g, kind).values())
        total += (len(NORMS) * D + 1 + numel + 3 * g.dense_inter * D + E * D + D + E + 3 * E * I * D) * 2
    return total
