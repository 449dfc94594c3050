"""Write a synthetic DeepSeek-V4 checkpoint (``DeepseekV4ForCausalLM``, ``models/deepseek_v4.py``) at a preset's shape
(``presets.DeepseekV4Shape``) in the layout DeepSeek releases DeepSeek-V4-Flash (``quant/dsv4_layout.py``), shard by
shard, in DeepSeek's own names: the routed experts ``layers.{i}.ffn.experts.{e}.w1/w3/w2`` in MXFP4 (int8 e2m1 bytes
beside e8m0 ``.scale``), the attention projections (``wq_a``, ``wq_b``, ``wkv``, ``wo_a``, ``wo_b``), the indexer's
``wq_b`` and the shared expert in FP8 e4m3 with ue8m0 128x128 block ``.scale``, the compressors' and the indexer's
other projections, routers, embeddings and head in bf16, hyper-connections, sinks, ``ape`` and router biases in
float32, the first ``hash_layers`` routed by token id (``gate.tid2eid``: distinct random experts per token).
config.json in the release's field names (``compress_ratios`` of the real model's first layers, ``num_hash_layers``,
``expert_dtype``, ``quantization_config``, YaRN ``rope_scaling``). No multi-token-prediction block.

``same_experts``: every expert of a layer the same random values (speed does not depend on them, and writing stays
disk-bound), as ``synthetic_frontier.py`` writes them; tests draw each expert and the weights wider (``std``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from freetoken.bench.presets import DeepseekV4Shape, MoEShape
from freetoken.bench.synthetic_experts import expert_tensors
from freetoken.quant.fp8_block import E4M3_MAX
from freetoken.quant.mxfp4 import MXFP4

CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
BLOCK = 128  # the FP8 weights' block rows and columns
QUANT_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
                "weight_block_size": [BLOCK, BLOCK]}  # fmt: skip


def ratios(num_layers: int) -> list[int]:
    """The real model's first layers' ``compress_ratios``: two sliding-window layers, then CSA (4) / HCA (128)."""
    return [0 if i < 2 else 4 if i % 2 == 0 else 128 for i in range(num_layers)]


def dsv4_config(s: MoEShape, v: DeepseekV4Shape, num_layers: int, max_positions: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": v.vocab,
        "hidden_size": s.hidden, "moe_intermediate_size": s.inter, "num_hidden_layers": num_layers,
        "num_attention_heads": v.heads, "num_key_value_heads": 1, "head_dim": v.head_dim,
        "qk_rope_head_dim": v.rope_dim, "q_lora_rank": v.q_lora, "o_lora_rank": v.o_lora, "o_groups": v.o_groups,
        "n_routed_experts": s.experts, "n_shared_experts": v.shared_experts, "num_experts_per_tok": s.top_k,
        "topk_method": "noaux_tc", "scoring_func": "sqrtsoftplus", "norm_topk_prob": True,
        "routed_scaling_factor": v.scale, "index_topk": v.index_topk, "index_n_heads": v.index_heads,
        "index_head_dim": v.index_dim, "compress_ratios": ratios(num_layers), "compress_rope_theta": 160000,
        "hc_mult": v.hc_mult, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_hash_layers": v.hash_layers,
        "swiglu_limit": 10.0, "expert_dtype": "fp4", "sliding_window": v.window, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                         "beta_slow": 1},
        "max_position_embeddings": max_positions, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
        "quantization_config": dict(QUANT_CONFIG),
    }  # fmt: skip
    if (v.csa_rate, v.hca_rate) != (4, 128):  # scaled down: transformers' own field beside the legacy ratios
        cfg["compress_rates"] = {CSA: v.csa_rate, HCA: v.hca_rate}
    return cfg


def fp8_ue8m0(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, cols]`` -> (e4m3, e8m0 ``[ceil(rows/128), ceil(cols/128)]``): DeepSeek's power-of-two block scale,
    the smallest at or above ``amax / 448``."""
    rows, cols = w.shape
    sr, sc = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = torch.zeros((sr * BLOCK, sc * BLOCK), dtype=torch.float32)
    padded[:rows, :cols] = w.float()
    blocks = padded.reshape(sr, BLOCK, sc, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp_min(2.0**-126) / E4M3_MAX)), torch.zeros_like(amax))
    q = torch.ldexp(blocks, -exp[:, None, :, None].to(torch.int32)).clamp(-E4M3_MAX, E4M3_MAX)
    q = q.to(torch.float8_e4m3fn).reshape(sr * BLOCK, sc * BLOCK)[:rows, :cols].contiguous()
    return q, (exp + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, cols]`` -> (int8 e2m1 bytes ``[rows, cols/2]``, e8m0 ``[rows, cols/32]``) as DeepSeek stores them."""
    packed, scale = MXFP4.quantize(w)
    assert scale is not None
    return packed.view(torch.int8), scale.view(torch.float8_e8m0fnu)


Shapes = dict[str, tuple[tuple[int, ...], str]]  # tensor name -> (shape, kind)


def _attention(p: str, s: MoEShape, v: DeepseekV4Shape, ratio: int) -> Shapes:
    """Layer tensors of the attention (after ``p`` = ``layers.{i}.attn.``): name -> (shape, kind); kinds: fp8
    (quantised, with a scale), bf16, f32, one (a bf16 norm of ones), f1 (float32 ones: the mixing gains)."""
    D, H, d, R = s.hidden, v.heads, v.head_dim, v.q_lora
    t: Shapes = {"wq_a.weight": ((R, D), "fp8"), "q_norm.weight": ((R,), "one"), "wq_b.weight": ((H * d, R), "fp8"),
         "wkv.weight": ((d, D), "fp8"), "kv_norm.weight": ((d,), "one"),
         "wo_a.weight": ((v.o_groups * v.o_lora, H * d // v.o_groups), "fp8"),
         "wo_b.weight": ((D, v.o_groups * v.o_lora), "fp8"), "attn_sink": ((H,), "f32")}  # fmt: skip
    if ratio:
        rate, s2 = (v.csa_rate, 2) if ratio == 4 else (v.hca_rate, 1)
        t |= {"compressor.wkv.weight": ((s2 * d, D), "bf16"), "compressor.wgate.weight": ((s2 * d, D), "bf16"),
              "compressor.ape": ((rate, s2 * d), "f32"), "compressor.norm.weight": ((d,), "one")}  # fmt: skip
    if ratio == 4:
        di, Hi = v.index_dim, v.index_heads
        t |= {"indexer.compressor.wkv.weight": ((2 * di, D), "bf16"),
              "indexer.compressor.wgate.weight": ((2 * di, D), "bf16"),
              "indexer.compressor.ape": ((v.csa_rate, 2 * di), "f32"),
              "indexer.compressor.norm.weight": ((di,), "one"), "indexer.wq_b.weight": ((Hi * di, R), "fp8"),
              "indexer.weights_proj.weight": ((Hi, D), "bf16")}  # fmt: skip
    return {p + k: x for k, x in t.items()}


def _layer(i: int, s: MoEShape, v: DeepseekV4Shape, ratio: int) -> Shapes:
    """Layer i's tensors but the routed experts and the hash table."""
    D, I, E, n = s.hidden, s.inter, s.experts, v.hc_mult
    p, f = f"layers.{i}.", f"layers.{i}.ffn."
    t: Shapes = {p + "attn_norm.weight": ((D,), "one"), p + "ffn_norm.weight": ((D,), "one")}
    for hc in ("hc_attn", "hc_ffn"):
        t |= {p + hc + "_fn": (((2 + n) * n, n * D), "f32"), p + hc + "_base": (((2 + n) * n,), "f32"),
              p + hc + "_scale": ((3,), "f1")}  # fmt: skip
    t |= _attention(p + "attn.", s, v, ratio)
    t[f + "gate.weight"] = ((E, D), "bf16")
    if i >= v.hash_layers:
        t[f + "gate.bias"] = ((E,), "f32")
    si = v.shared_experts * I
    t |= {f + "shared_experts.w1.weight": ((si, D), "fp8"), f + "shared_experts.w3.weight": ((si, D), "fp8"),
          f + "shared_experts.w2.weight": ((D, si), "fp8")}  # fmt: skip
    return t


def write_dsv4(
    directory: Path, shape: MoEShape, num_layers: int, max_positions: int = 1048576, embed_std: float = 0.02,
    seed: int = 0, same_experts: bool = True, std: float = 0.02,
) -> int:  # fmt: skip
    """One shard per layer (its routed experts in a second); returns the total bytes written."""
    v = shape.dsv4
    assert v is not None, f"{shape.name} is not a DeepSeek-V4 preset"
    if shape.fmt.name != "mxfp4":
        raise ValueError(f"DeepSeek-V4 ships MXFP4 routed experts; no release layout for {shape.fmt.name}")
    directory.mkdir(parents=True, exist_ok=True)
    cfg = dsv4_config(shape, v, num_layers, max_positions)
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    g = torch.Generator().manual_seed(seed)
    D, I, E, V, n = shape.hidden, shape.inter, shape.experts, v.vocab, v.hc_mult

    def rnd(*dims: int) -> torch.Tensor:
        return torch.randn(dims, generator=g) * std

    def make(dims: tuple[int, ...], kind: str) -> torch.Tensor:
        if kind in ("one", "f1"):
            return torch.ones(dims, dtype=torch.bfloat16 if kind == "one" else torch.float32)
        return rnd(*dims).to(torch.bfloat16) if kind in ("bf16", "fp8") else rnd(*dims)

    weight_map: dict[str, str] = {}
    total = 0

    def flush(tensors: dict[str, torch.Tensor], file: str) -> None:
        nonlocal total
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        for name, x in tensors.items():
            weight_map[name], total = file, total + x.numel() * x.element_size()

    head = {"embed.weight": (torch.randn((V, D), generator=g) * embed_std).to(torch.bfloat16),
            "head.weight": rnd(V, D).to(torch.bfloat16), "norm.weight": torch.ones(D, dtype=torch.bfloat16),
            "hc_head_fn": rnd(n, n * D), "hc_head_base": rnd(n), "hc_head_scale": torch.ones(1)}  # fmt: skip
    flush(head, "model-embed.safetensors")
    kinds = ratios(num_layers)
    for i in range(num_layers):
        t: dict[str, torch.Tensor] = {}
        for name, (dims, kind) in _layer(i, shape, v, kinds[i]).items():
            x = make(dims, kind)
            if kind == "fp8":
                t[name], t[name.removesuffix(".weight") + ".scale"] = fp8_ue8m0(x)
            else:
                t[name] = x
        if i < v.hash_layers:
            ranks = torch.rand((V, E), generator=g).argsort(dim=-1)[:, : shape.top_k]
            t[f"layers.{i}.ffn.gate.tid2eid"] = ranks.contiguous()
        flush(t, f"model-layer{i:03d}.safetensors")
        def one_expert() -> dict[str, torch.Tensor]:
            packs = [fp4(rnd(*dims)) for dims in ((I, D), (I, D), (D, I))]
            return {f"{w}.{part}": t for w, (q, sc) in zip(("w1", "w3", "w2"), packs)
                    for part, t in (("weight", q), ("scale", sc))}  # fmt: skip

        experts = expert_tensors(E, one_expert, f"layers.{i}.ffn.experts.", same_experts)
        flush(experts, f"model-layer{i:03d}-experts.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def dsv4_bytes(shape: MoEShape, num_layers: int) -> int:
    """The bytes ``write_dsv4`` writes for ``shape`` at ``num_layers``, from shapes alone."""
    v = shape.dsv4
    assert v is not None, f"{shape.name} is not a DeepSeek-V4 preset"
    D, I, E, V, n = shape.hidden, shape.inter, shape.experts, v.vocab, v.hc_mult
    item = {"fp8": 1, "bf16": 2, "one": 2, "f32": 4, "f1": 4}
    total = 2 * V * D * 2 + D * 2 + (n * n * D + n + 1) * 4
    kinds = ratios(num_layers)
    for i in range(num_layers):
        for dims, kind in _layer(i, shape, v, kinds[i]).values():
            total += math.prod(dims) * item[kind]
            if kind == "fp8":
                total += -(-dims[0] // BLOCK) * -(-dims[1] // BLOCK)
        total += V * shape.top_k * 8 if i < v.hash_layers else 0
        total += E * (2 * MXFP4.row_bytes(I, D, 2) + MXFP4.row_bytes(D, I, 2))
    return total
