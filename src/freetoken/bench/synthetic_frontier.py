"""Write a synthetic checkpoint of a sigmoid-routed frontier model (``presets.FrontierShape``: GLM-4.5 to 4.7,
MiniMax-M2; with latent attention, ``bench/synthetic_mla.py``: DeepSeek-V3/V3.2, GLM-5) with its real per-layer
shapes, shard by shard: the first dense layers, attention with that family's biases, norms and partial rotary, routed
experts (every expert of a layer the same random values: speed does not depend on them, and writing stays disk-bound),
shared experts, the router and its correction bias. With a quantised ``fmt`` every projection of whole blocks is
written packed with its scales, as the FP8 releases ship them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from freetoken.bench.presets import FrontierShape, MoEShape
from freetoken.bench.synthetic_mla import ARCH as MLA_ARCH
from freetoken.bench.synthetic_mla import mla_bytes, mla_config, mla_tensors
from freetoken.quant import BF16, FP8_BLOCK_128, WeightFormat

ARCH = {"glm4_moe": "Glm4MoeForCausalLM", "minimax_m2": "MiniMaxM2ForCausalLM", **MLA_ARCH}


def frontier_config(s: MoEShape, f: FrontierShape, num_layers: int, vocab: int, max_positions: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": [ARCH[f.family]], "model_type": f.family, "vocab_size": vocab, "hidden_size": s.hidden,
        "num_hidden_layers": num_layers, "num_attention_heads": f.heads, "num_key_value_heads": f.kv_heads,
        "head_dim": f.head_dim, "num_experts_per_tok": s.top_k, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "max_position_embeddings": max_positions, "dtype": "bfloat16", "norm_topk_prob": True,
    }  # fmt: skip
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": f.rope_theta,
                              "partial_rotary_factor": f.partial_rotary}  # fmt: skip
    if f.mla is not None:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": f.rope_theta}
        cfg |= mla_config(f.mla) | {"num_key_value_heads": f.heads}
    if f.family != "minimax_m2":
        return cfg | {
            "intermediate_size": f.dense_inter, "moe_intermediate_size": s.inter, "n_routed_experts": s.experts,
            "n_shared_experts": f.shared_experts, "first_k_dense_replace": f.dense_layers, "n_group": f.n_group,
            "topk_group": f.topk_group, "routed_scaling_factor": f.scale, "num_nextn_predict_layers": 0,
        } | ({} if f.mla else {"use_qk_norm": True, "attention_bias": True})  # fmt: skip
    return cfg | {"intermediate_size": s.inter, "num_local_experts": s.experts, "scoring_func": "sigmoid"}


def write_frontier(
    directory: Path, shape: MoEShape, num_layers: int, vocab: int = 32000, max_positions: int = 4096,
    embed_std: float = 0.02, fmt: WeightFormat = BF16, seed: int = 0,
) -> int:  # fmt: skip
    """One shard per layer; returns the total weight bytes written."""
    f = shape.frontier
    assert f is not None, f"{shape.name} is not a frontier preset"
    if fmt.quantized and fmt != FP8_BLOCK_128:
        raise ValueError(f"no checkpoint layout for {fmt.name}")
    directory.mkdir(parents=True, exist_ok=True)
    cfg = frontier_config(shape, f, num_layers, vocab, max_positions)
    if fmt.quantized:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                      "activation_scheme": "dynamic"}  # fmt: skip
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    g = torch.Generator().manual_seed(seed)
    D, I, E, dt = shape.hidden, shape.inter, shape.experts, torch.bfloat16
    glm = f.family != "minimax_m2"  # GLM's and DeepSeek's MoE names

    def rnd(*dims: int) -> torch.Tensor:
        return (torch.randn(dims, generator=g) * 0.02).to(dt)

    def pack(name: str, w: torch.Tensor, out: dict[str, torch.Tensor]) -> None:
        whole = w.dim() == 2 and w.shape[0] % 128 == 0 and w.shape[1] % 128 == 0
        if fmt.quantized and whole and name.endswith("proj.weight"):  # embeddings, head, router stay bf16
            out[name], scale = fmt.quantize(w)
            assert scale is not None
            out[fmt.scale_name(name)] = scale
        else:
            out[name] = w

    weight_map: dict[str, str] = {}
    total = 0

    def flush(tensors: dict[str, torch.Tensor], file: str) -> None:
        nonlocal total
        out: dict[str, torch.Tensor] = {}
        for name, w in tensors.items():
            pack(name, w, out)
        save_file(out, str(directory / file))
        for k, v in out.items():
            weight_map[k], total = file, total + v.numel() * v.element_size()

    embed = (torch.randn((vocab, D), generator=g) * embed_std).to(dt)
    ones = lambda n: torch.ones(n, dtype=dt)  # noqa: E731
    flush({"model.embed_tokens.weight": embed, "lm_head.weight": rnd(vocab, D), "model.norm.weight": ones(D)},
          "model-embed.safetensors")  # fmt: skip
    H, Hkv, hd = f.heads, f.kv_heads, f.head_dim
    for i in range(num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        t = {p + "input_layernorm.weight": ones(D), p + "post_attention_layernorm.weight": ones(D)}
        if f.mla is not None:
            t |= mla_tensors(a, f.mla, D, H, rnd, dt)
        else:
            t |= {a + "q_proj.weight": rnd(H * hd, D), a + "k_proj.weight": rnd(Hkv * hd, D),
                  a + "v_proj.weight": rnd(Hkv * hd, D), a + "o_proj.weight": rnd(D, H * hd)}  # fmt: skip
            norm_q, norm_k = (hd, hd) if glm else (H * hd, Hkv * hd)  # GLM per head, MiniMax-M2 over all heads
            t |= {a + "q_norm.weight": ones(norm_q), a + "k_norm.weight": ones(norm_k)}
        if glm and f.mla is None:
            t |= {a + "q_proj.bias": rnd(H * hd), a + "k_proj.bias": rnd(Hkv * hd), a + "v_proj.bias": rnd(Hkv * hd)}
        if i < f.dense_layers:
            t |= {p + "mlp.gate_proj.weight": rnd(f.dense_inter, D), p + "mlp.up_proj.weight": rnd(f.dense_inter, D),
                  p + "mlp.down_proj.weight": rnd(D, f.dense_inter)}  # fmt: skip
            flush(t, f"model-layer{i:03d}.safetensors")
            continue
        m = p + ("mlp." if glm else "block_sparse_moe.")
        t[m + "gate.weight"] = rnd(E, D)
        t[m + ("gate.e_score_correction_bias" if glm else "e_score_correction_bias")] = torch.zeros(E)
        if f.shared_experts:
            si = f.shared_experts * I
            t |= {m + "shared_experts.gate_proj.weight": rnd(si, D), m + "shared_experts.up_proj.weight": rnd(si, D),
                  m + "shared_experts.down_proj.weight": rnd(D, si)}  # fmt: skip
        names = ("gate_proj", "up_proj", "down_proj") if glm else ("w1", "w3", "w2")
        one = {n: fmt_once(w, fmt) for n, w in zip(names, (rnd(I, D), rnd(I, D), rnd(D, I)))}  # packed once a layer
        out: dict[str, torch.Tensor] = {}
        for e in range(E):
            for n, (q, scale) in one.items():
                name = m + f"experts.{e}.{n}.weight"
                out[name] = q.clone()
                if scale is not None:
                    out[fmt.scale_name(name)] = scale.clone()
        flush(t, f"model-layer{i:03d}.safetensors")
        save_file(out, str(directory / f"model-layer{i:03d}-experts.safetensors"))
        for k, v in out.items():
            weight_map[k], total = f"model-layer{i:03d}-experts.safetensors", total + v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def fmt_once(w: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An expert weight as the checkpoint stores it: packed with its scales in a quantised format."""
    return fmt.quantize(w) if fmt.quantized else (w, None)


def frontier_bytes(shape: MoEShape, num_layers: int, vocab: int = 32000) -> int:
    """The bytes ``write_frontier`` writes for ``shape`` at ``num_layers`` (dense layers count), from shapes alone:
    how many layers fit a disk or RAM budget."""
    f = shape.frontier
    assert f is not None, f"{shape.name} is not a frontier preset"
    fmt, D, I, E = shape.fmt, shape.hidden, shape.inter, shape.experts
    H, Hkv, hd, glm = f.heads, f.kv_heads, f.head_dim, f.family != "minimax_m2"

    def proj(rows: int, cols: int) -> int:
        whole = fmt.quantized and rows % 128 == 0 and cols % 128 == 0
        return fmt.row_bytes(rows, cols, 2) if whole else rows * cols * 2

    total = 2 * vocab * D * 2 + D * 2
    for i in range(num_layers):
        total += 2 * D * 2
        if f.mla is not None:
            total += mla_bytes(f.mla, D, H, proj)
        else:
            total += proj(H * hd, D) + 2 * proj(Hkv * hd, D) + proj(D, H * hd)
            total += ((hd + hd) if glm else (H * hd + Hkv * hd)) * 2 + (((H + 2 * Hkv) * hd * 2) if glm else 0)
        if i < f.dense_layers:
            total += 2 * proj(f.dense_inter, D) + proj(D, f.dense_inter)
            continue
        total += E * D * 2 + E * 4  # the router (bf16) and its correction bias (float32)
        si = f.shared_experts * I
        total += (2 * proj(si, D) + proj(D, si)) if si else 0
        total += E * (2 * proj(I, D) + proj(D, I))
    return total
