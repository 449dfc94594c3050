"""Write a synthetic Qwen3-MoE checkpoint of a chosen size to disk, shard by shard (bounded memory); with a
quantised ``fmt`` (a preset's, e.g. ``qwen3-30b-a3b-fp8``) every projection of whole blocks is written packed
with its scales and ``quantization_config``, as the FP8 releases ship it (NVFP4: ModelOpt's layout; MXFP4: the
routed experts only); with ``hybrid`` a Qwen3.5-MoE
(``synthetic_hybrid.py``: gated DeltaNet and gated attention layers, a shared expert)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from freetoken.bench.presets import HybridShape
from freetoken.bench.synthetic_hybrid import hybrid_config, layer_tensors
from freetoken.quant import BF16, FP8_BLOCK_128, WeightFormat


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
    embed_std: float = 0.02,
    fmt: WeightFormat = BF16,
    hybrid: HybridShape | None = None,
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
    if hybrid is not None:
        cfg |= hybrid_config(hybrid, num_layers)
    if fmt == FP8_BLOCK_128:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                      "activation_scheme": "dynamic"}  # fmt: skip
    elif fmt.name == "nvfp4":  # ModelOpt's layout (config.json form): every projection packed
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    elif fmt.name == "mxfp4":  # the routed experts packed, per weight (``weight`` + ``weight_scale``)
        cfg["quantization_config"] = {"quant_method": "mxfp4"}
    elif fmt.quantized:
        raise ValueError(f"no checkpoint layout for {fmt.name}")
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * 0.02).to(dtype)

    weight_map: dict[str, str] = {}
    total = 0

    def packed(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Projections of whole blocks in ``fmt``, each with its scale tensor (the rest as they are)."""
        if not fmt.quantized:
            return tensors
        out: dict[str, torch.Tensor] = {}
        for k, v in tensors.items():
            if fmt.name == "fp8_block":
                whole = v.dim() == 2 and v.shape[0] % 128 == 0 and v.shape[1] % 128 == 0
            else:  # FP4: whole groups; MXFP4 releases pack the routed experts only
                whole = v.dim() == 2 and v.shape[1] % 32 == 0 and (fmt.name == "nvfp4" or ".mlp.experts." in k)
            if k.endswith("proj.weight") and whole and v.dtype != fmt.packed_dtype:  # packed already: as it is
                out.update(fmt.checkpoint_tensors(k, v))
            else:
                out[k] = v
        return out

    def flush(tensors: dict[str, torch.Tensor], name: str) -> None:
        nonlocal total
        tensors, seen = packed(tensors), set()
        for k, v in tensors.items():  # safetensors >= 0.8 refuses tensors sharing storage (``shared_experts``)
            ptr = v.untyped_storage().data_ptr()
            tensors[k] = v.clone() if ptr in seen else v
            seen.add(ptr)
        save_file(tensors, str(directory / name))
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()

    norm = torch.zeros if hybrid is not None else torch.ones  # Qwen3.5's norms scale by 1 + w
    embed = (torch.randn((vocab, hidden), generator=g) * embed_std).to(dtype)
    flush({"model.embed_tokens.weight": embed, "lm_head.weight": rnd(vocab, hidden),
           "model.norm.weight": norm(hidden, dtype=dtype)}, "model-embed.safetensors")
    for i in range(num_layers):
        p = f"model.layers.{i}."
        t = {
            p + "input_layernorm.weight": norm(hidden, dtype=dtype),
            p + "post_attention_layernorm.weight": norm(hidden, dtype=dtype),
            p + "mlp.gate.weight": rnd(num_experts, hidden),
        }
        if hybrid is not None:
            t |= layer_tensors(hybrid, p, i, hidden, rnd, dtype)
        else:
            t |= {
                p + "self_attn.q_proj.weight": rnd(heads * hd, hidden),
                p + "self_attn.k_proj.weight": rnd(kv_heads * hd, hidden),
                p + "self_attn.v_proj.weight": rnd(kv_heads * hd, hidden),
                p + "self_attn.o_proj.weight": rnd(hidden, heads * hd),
                p + "self_attn.q_norm.weight": torch.ones(hd, dtype=dtype),
                p + "self_attn.k_norm.weight": torch.ones(hd, dtype=dtype),
            }
        one = (rnd(moe_inter, hidden), rnd(moe_inter, hidden), rnd(hidden, moe_inter)) if shared_experts else None
        # once a layer, under a placeholder name ("W.weight") renamed per expert below
        one_packed = [fmt.checkpoint_tensors("W.weight", w) for w in one] if one is not None and fmt.quantized else None
        for e in range(num_experts):
            gate, up, down = one or (rnd(moe_inter, hidden), rnd(moe_inter, hidden), rnd(hidden, moe_inter))
            names = [p + f"mlp.experts.{e}.{n}_proj.weight" for n in ("gate", "up", "down")]
            for j, (name, w) in enumerate(zip(names, (gate, up, down))):
                if one_packed is None:
                    t[name] = w
                    continue
                t.update({name[: -len("weight")] + k[2:]: v.clone() for k, v in one_packed[j].items()})
        flush(t, f"model-layer{i:03d}.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total
