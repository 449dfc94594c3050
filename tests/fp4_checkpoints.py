"""Tiny fake FP4 Qwen3-MoE checkpoints in their releases' real layouts, written by the ``quant/`` quantisers, and
their dequantised twins (the oracle's model).

Layouts: ``nvfp4`` (ModelOpt: ``weight`` uint8, ``weight_scale`` e4m3, ``weight_scale_2`` f32, ``input_scale``;
``hf_quant_config.json``), ``nvfp4-ct`` (compressed-tensors ``nvfp4-pack-quantized``: ``weight_packed``,
``weight_scale``, ``weight_global_scale``; ``quantization_config`` in config.json) and ``mxfp4-ct``
(compressed-tensors ``mxfp4-pack-quantized``: ``weight_packed``, e8m0 ``weight_scale`` in uint8). NVFP4 releases
quantise every linear layer but the head and the router (so attention and the dense MLP are dequantised at
load); MXFP4 ones the routed experts only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from freetoken.quant import MXFP4, NVFP4, NVFP4_COMPRESSED_TENSORS, WeightFormat
from tiny_models import make_config

LAYOUTS = ("nvfp4", "nvfp4-ct", "mxfp4-ct")
_FORMATS: dict[str, WeightFormat] = {"nvfp4": NVFP4, "nvfp4-ct": NVFP4_COMPRESSED_TENSORS, "mxfp4-ct": MXFP4}
_CT_GROUP = {"nvfp4-ct": ("nvfp4-pack-quantized", 16), "mxfp4-ct": ("mxfp4-pack-quantized", 32)}


def layout_format(layout: str) -> WeightFormat:
    return _FORMATS[layout]


def quantised(layout: str, name: str) -> bool:
    """Whether ``name`` (a float checkpoint's weight) is stored packed in ``layout``."""
    if not name.endswith("proj.weight") or ".mlp.gate." in name:
        return False
    return ".experts." in name or layout.startswith("nvfp4")


def packed_name(layout: str, name: str) -> str:
    return name + "_packed" if layout.endswith("-ct") else name


def save_fp4_checkpoint(directory: Path, layout: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A fake ``layout`` checkpoint of the tiny Qwen3-MoE (``make_config("qwen3_moe")``, weights std 0.2);
    returns the checkpoint's tensors by name (what was written)."""
    from safetensors.torch import load_file, save_file

    from tiny_models import _random_model

    fmt = layout_format(layout)
    _random_model(make_config("qwen3_moe"), seed).save_pretrained(directory)
    state = load_file(directory / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if quantised(layout, name):
            out.update(fmt.checkpoint_tensors(packed_name(layout, name), t))
        else:
            out[name] = t
    save_file(out, directory / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    if layout == "nvfp4":  # ModelOpt's own file (config.json stays without quantization_config)
        q = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head", "*.mlp.gate"]}
        (directory / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt"}, "quantization": q})
        )
    else:
        fmt_name, group = _CT_GROUP[layout]
        weights = {"num_bits": 4, "type": "float", "group_size": group, "symmetric": True, "strategy": "group"}
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": fmt_name, "ignore": ["lm_head", "re:.*mlp.gate$"],
            "config_groups": {"group_0": {"format": fmt_name, "targets": ["Linear"], "weights": weights}},
        }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def dequantised_state(layout: str, tensors: dict[str, torch.Tensor], float_names: list[str]) -> dict[str, Any]:
    """The float state (``float_names``, the original checkpoint's) of a fake checkpoint's ``tensors``, every packed
    weight dequantised in float32 by the format's reference."""
    fmt = layout_format(layout)
    out: dict[str, torch.Tensor] = {}
    for name in float_names:
        if not quantised(layout, name):
            out[name] = tensors[name]
            continue
        p = packed_name(layout, name)
        s2 = tensors.get(fmt.scale2_name(p)) if fmt.scale2_name(p) else None
        out[name] = fmt.dequantize(tensors[p], fmt.bank_scale(tensors[fmt.scale_name(p)], s2), torch.float32)
    return out


def save_dequantised_twin(src: Path, dst: Path, layout: str, tensors: dict[str, torch.Tensor]) -> Any:
    """The float checkpoint of ``src``'s dequantised weights at ``dst``, loaded as transformers' model (float32)."""
    import shutil

    import transformers as tf
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=True)
    float_names = [n for n in tensors if not _side(n)]
    names = [n.removesuffix("_packed") for n in float_names]
    save_file(dequantised_state(layout, tensors, names), dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (dst / "config.json").write_text(json.dumps(cfg))
    for extra in ("generation_config.json",):
        if (src / extra).exists():
            shutil.copy(src / extra, dst / extra)
    return tf.AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()


def _side(name: str) -> bool:
    return name.endswith(("weight_scale", "weight_scale_2", "weight_global_scale", "input_scale"))
