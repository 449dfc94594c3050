"""A tiny fake gpt-oss checkpoint with its routed experts in MXFP4 as OpenAI ships them, written independently of
``quant/`` (the engine's quantiser and reference), and transformers' own dequantised load of it (the oracle).

Layout (transformers' ``integrations/mxfp4.py``): ``mlp.experts.gate_up_proj_blocks`` [E, 2I, D/32, 16] uint8,
``gate_up_proj_scales`` [E, 2I, D/32] uint8, ``down_proj_blocks`` [E, D, I/32, 16], ``down_proj_scales`` [E, D, I/32]:
rows are output features (gate/up interleaved: row 2j gate j, 2j + 1 up j), a block is 32 e2m1 codes along the input
features, two a byte with the even element in the low nibble, and an e8m0 scale ``2^(s - 127)`` per block; the float
biases stay as they are. ``quantization_config`` is ``{"quant_method": "mxfp4"}`` with the attention, router,
embeddings and head left unconverted.

The writer follows the OCP MX specification (v1.0, §6.3): the shared exponent is ``floor(log2(amax)) - 2`` (2: the
e2m1 maximum's exponent), each element the e2m1 value nearest to ``x / 2^exp`` (saturating at ±6; ties to the even
code). Transformers cannot quantise to MXFP4 on the CPU (its quantiser needs the ``triton_kernels`` hub kernels),
but it dequantises on the CPU (``Mxfp4Config(dequantize=True)``), and that load is the reference model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
EXPERTS = ("gate_up_proj", "down_proj")
UNCONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def spec_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., rows, cols]`` floats -> (blocks ``[..., rows, cols/32, 16]`` uint8, scales ``[..., rows, cols/32]``
    uint8), by the OCP MX rule: the nearest of the 8 magnitudes by distance, a tie to the even code (mantissa 0)."""
    *lead, cols = w.shape
    g = w.double().reshape(*lead, cols // 32, 32)
    amax = g.abs().amax(dim=-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - 2, torch.zeros_like(amax))
    x = g / torch.pow(2.0, exp)[..., None]
    values = torch.tensor(E2M1[:8], dtype=torch.float64)
    odd = torch.arange(8) % 2 * 1e-9  # exact ties (x is exact in float64) broken towards the even code
    mag = ((x.abs()[..., None] - values).abs() + odd).argmin(dim=-1)
    codes = (mag | ((x < 0) & (mag > 0)).long() << 3).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exp + 127).to(torch.uint8)


def spec_dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The inverse, from the specification: ``[..., rows, G, 16]`` blocks and ``[..., rows, G]`` scales ->
    ``[..., rows, 32 G]`` float32 (row-major, as stored: output features by input features)."""
    b = blocks.long()
    codes = torch.stack((b & 15, b >> 4), dim=-1).reshape(*blocks.shape[:-1], 32)
    v = torch.tensor(E2M1, dtype=torch.float64)[codes] * torch.pow(2.0, scales.double() - 127)[..., None]
    return v.reshape(*blocks.shape[:-2], -1).float()


def write_mxfp4_checkpoint(model: Any, directory: Path) -> dict[str, torch.Tensor]:
    """``model`` (a transformers gpt-oss) saved with its routed experts in MXFP4; returns what was written."""
    from safetensors.torch import load_file, save_file

    model.save_pretrained(directory)
    out: dict[str, torch.Tensor] = {}
    for name, t in load_file(directory / "model.safetensors").items():
        if name.endswith(EXPERTS):  # stored [E, in, out] -> blocks along `in` of [E, out, in]
            out[name + "_blocks"], out[name + "_scales"] = spec_quantize(t.transpose(1, 2))
        else:
            out[name] = t
    save_file(out, directory / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": UNCONVERTED}
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def load_dequantised(directory: Path) -> Any:
    """Transformers' own load of the MXFP4 checkpoint, dequantised (float32 weights, the reference model)."""
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, quantization_config=tf.Mxfp4Config(dequantize=True)
    ).eval()


def rewrite(directory: Path, edit: dict[str, torch.Tensor | None]) -> None:
    """Replace (or, for None, drop) tensors of the checkpoint at ``directory`` (bad-input tests)."""
    from safetensors.torch import load_file, save_file

    state = load_file(directory / "model.safetensors")
    for name, t in edit.items():
        if t is None:
            state.pop(name)
        else:
            state[name] = t
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
