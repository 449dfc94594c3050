"""A tiny DeepSeek-V4 checkpoint in the layout DeepSeek releases (DeepSeek-V4-Flash), written independently of
``quant/`` from the formats' specifications, and its dequantised twin saved in float32 (the oracle's model).

Layout: DeepSeek's own names (``embed.weight``, ``layers.{i}.attn.wq_a.weight``, ``attn.kv_norm.weight``,
``hc_head_fn``, no ``model.``);
routed experts ``layers.{i}.ffn.experts.{e}.w{1,2,3}.weight`` int8 ``[rows, cols / 2]`` (two e2m1 codes a byte, the
even element in the low nibble) beside ``.scale`` float8_e8m0fnu ``[rows, cols / 32]``; the attention projections
(``wq_a``, ``wq_b``, ``wkv``, ``wo_a``, ``wo_b``), the indexer's ``wq_b`` and the shared expert in float8 e4m3 beside
``.scale`` float8_e8m0fnu ``[ceil(rows / 128), ceil(cols / 128)]``; the compressors' projections, the indexer's
``weights_proj``, routers, embeddings, head, norms and the hyper-connections unquantised. config.json:
``quantization_config`` ``{quant_method: fp8, fmt: e4m3, scale_fmt: ue8m0, weight_block_size: [128, 128],
activation_scheme: dynamic}`` and ``expert_dtype: fp4``.

The writer: MXFP4 by the OCP MX rule (``gpt_oss_mxfp4.spec_quantize``: shared exponent ``floor(log2 amax) - 2``,
e8m0 ``2^(x - 127)``, the e2m1 table); FP8 blocks with DeepSeek's ue8m0 scale, the power of two at or above
``amax / 448`` (``ceil(log2(amax / 448))``), the elements rounded to e4m3 by torch's cast (round to nearest even).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from gpt_oss_mxfp4 import E2M1, spec_quantize

QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
                "activation_scheme": "dynamic"}  # fmt: skip
EXPERT = re.compile(r"(^|\.)ffn\.experts\.\d+\.w[123]\.weight$")
FP8 = re.compile(r"(^|\.)(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|attn\.indexer\.wq_b|ffn\.shared_experts\.w[123])\.weight$")
BLOCK = 128


def shipped_name(name: str) -> str:
    """transformers' ``save_pretrained`` name -> DeepSeek's own."""
    name = name.removeprefix("model.").replace("embed_tokens.", "embed.").replace("hc_head.hc_", "hc_head_")
    return re.sub(r"\.attn\.norm\.weight$", ".attn.kv_norm.weight", name)


def fp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, cols]`` -> (int8 ``[rows, cols / 2]``, e8m0 ``[rows, cols / 32]`` as float8_e8m0fnu)."""
    blocks, scales = spec_quantize(w)
    packed = blocks.reshape(*w.shape[:-1], w.shape[-1] // 2)
    return packed.view(torch.int8).contiguous(), scales.view(torch.float8_e8m0fnu).contiguous()


def fp4_dequantize(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8).long()
    codes = torch.stack((b & 15, b >> 4), dim=-1).reshape(*packed.shape[:-1], -1)
    v = torch.tensor(E2M1, dtype=torch.float64)[codes]
    s = torch.pow(2.0, scale.view(torch.uint8).double() - 127).repeat_interleave(32, dim=-1)
    return (v * s).float()


def fp8_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, cols]`` -> (float8_e4m3fn ``[rows, cols]``, e8m0 ``[ceil(rows/128), ceil(cols/128)]``)."""
    rows, cols = w.shape
    sr, sc = -(-rows // BLOCK), -(-cols // BLOCK)
    q = torch.empty((rows, cols), dtype=torch.float8_e4m3fn)
    exps = torch.empty((sr, sc), dtype=torch.int64)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK].double()
            amax = float(blk.abs().max())
            e = int(torch.ceil(torch.log2(torch.tensor(amax / 448.0, dtype=torch.float64)))) if amax > 0 else 0
            exps[i, j] = e
            q[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK] = (blk / 2.0**e).float().to(q.dtype)
    return q, (exps + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    s = torch.pow(2.0, scale.view(torch.uint8).double() - 127)
    s = s.repeat_interleave(BLOCK, 0)[: q.shape[0]].repeat_interleave(BLOCK, 1)[:, : q.shape[1]]
    return (q.double() * s).float()


def write_released(src: Path, dst: Path, float_twin: Path | None = None) -> dict[str, torch.Tensor]:
    """The float checkpoint in ``src`` (``tiny_dsv4.save_dsv4_checkpoint``) -> the released layout in ``dst``; its
    dequantised twin (transformers' names, float32, the same config unquantised) in ``float_twin``. Returns the
    tensors written to ``dst``."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        new = shipped_name(name)
        if EXPERT.search(new):
            q, s = fp4_quantize(t.float())
            out[new], out[new.removesuffix(".weight") + ".scale"] = q, s
            twin[name] = fp4_dequantize(q, s)
        elif FP8.search(new):
            q, s = fp8_quantize(t.float())
            out[new], out[new.removesuffix(".weight") + ".scale"] = q, s
            twin[name] = fp8_dequantize(q, s)
        else:
            out[new] = t.to(torch.bfloat16) if t.is_floating_point() and t.dim() == 2 and "hc_" not in new else t
            twin[name] = out[new].float() if t.is_floating_point() else t
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": QUANT_CONFIG, "expert_dtype": "fp4"}))
    if float_twin is not None:
        float_twin.mkdir(parents=True, exist_ok=True)
        save_file(twin, float_twin / "model.safetensors", metadata={"format": "pt"})
        (float_twin / "config.json").write_text(json.dumps(cfg))
    return out


def load_twin(float_twin: Path) -> Any:
    """transformers' own model of the dequantised twin (float32)."""
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(float_twin, dtype=torch.float32).eval()
