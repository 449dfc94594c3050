"""Read a Hugging Face ``config.json`` (transformers-5 form and the older form) into one typed view."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freetoken.checkpoint.errors import CheckpointError


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # default | linear | llama3 | yarn
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HFConfig:
    """The fields our model families use, normalised across config generations."""

    path: Path
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    sliding_window: int | None
    # MoE (num_experts == 0: dense)
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    shared_expert_intermediate_size: int
    mlp_only_layers: tuple[int, ...]
    decoder_sparse_step: int
    eos_token_ids: tuple[int, ...]
    dtype: str | None
    raw: dict[str, Any]
    layer_types: tuple[str, ...] | None = None  # per layer ("full_attention", "linear_attention", ...); None: unsaid
    first_k_dense: int = 0  # DeepSeek-style ``first_k_dense_replace``: the first k layers have a dense MLP

    def is_moe_layer(self, i: int) -> bool:
        return (
            self.num_experts > 0
            and i >= self.first_k_dense
            and i not in self.mlp_only_layers
            and (i + 1) % max(self.decoder_sparse_step, 1) == 0
        )

    @property
    def moe_layer_ids(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]


def _rope(raw: dict[str, Any], head_dim: int) -> RopeConfig:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    extra = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type", "type")}
    if "partial_rotary_factor" not in extra:  # the older form: top level, or MiniMax-M2's rotary_dim
        if raw.get("partial_rotary_factor") is not None:
            extra["partial_rotary_factor"] = float(raw["partial_rotary_factor"])
        elif raw.get("rotary_dim"):
            extra["partial_rotary_factor"] = int(raw["rotary_dim"]) / head_dim
    return RopeConfig(theta=theta, kind=str(kind), params=extra)


def _eos(directory: Path, raw: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (raw, _load_json(directory / "generation_config.json")):
        value = source.get("eos_token_id")
        if isinstance(value, int):
            ids.append(value)
        elif isinstance(value, list):
            ids.extend(int(v) for v in value)
    return tuple(dict.fromkeys(ids))


def _load_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def load_hf_config(directory: str | Path) -> HFConfig:
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"{d}: model directory does not exist")
    path = d / "config.json"
    if not path.exists():
        raise CheckpointError(f"{path}: missing (not a Hugging Face checkpoint directory)")
    raw = _load_json(path)
    raw = {**raw.get("text_config", {}), **raw} if "text_config" in raw else raw
    raw = _with_modelopt_config(d, raw)
    archs = raw.get("architectures") or []
    if not archs:
        raise CheckpointError(f"{path}: no 'architectures' entry")
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        head_dim = int(raw.get("head_dim") or hidden // heads)
        num_experts = int(raw.get("num_local_experts", raw.get("num_experts", raw.get("n_routed_experts", 0))) or 0)
        moe_inter = int(raw.get("moe_intermediate_size") or raw.get("intermediate_size", 0))
        return HFConfig(
            path=d,
            architecture=str(archs[0]),
            model_type=str(raw.get("model_type", "")),
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=int(raw.get("intermediate_size", 0)),
            rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_rope(raw, head_dim),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", raw.get("qkv_bias", False))),
            sliding_window=_sliding_window(raw),
            num_experts=num_experts,
            top_k=int(raw.get("num_experts_per_tok", raw.get("top_k_experts", 0)) or 0),  # Gemma-4: top_k_experts
            moe_intermediate_size=moe_inter,
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
            # Qwen2-MoE names the shared expert's width; DeepSeek-style configs count shared experts of the routed width
            shared_expert_intermediate_size=int(
                raw.get("shared_expert_intermediate_size") or int(raw.get("n_shared_experts") or 0) * moe_inter
            ),
            mlp_only_layers=_mlp_only_layers(raw),
            decoder_sparse_step=int(raw.get("decoder_sparse_step", 1) or 1),
            eos_token_ids=_eos(d, raw),
            dtype=raw.get("dtype", raw.get("torch_dtype")),
            raw=raw,
            layer_types=_layer_types(raw),
            first_k_dense=int(raw.get("first_k_dense_replace", 0) or 0),
        )
    except KeyError as e:
        raise CheckpointError(f"{path}: required field {e.args[0]!r} is missing") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: a field has the wrong type ({e})") from None


def _with_modelopt_config(directory: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """A ModelOpt export without ``quantization_config`` in config.json declares it in ``hf_quant_config.json``
    (``{"quantization": {"quant_algo": ..., "group_size": ...}}``): read as ``quant_method: modelopt``."""
    if raw.get("quantization_config") or raw.get("compression_config"):
        return raw
    extra = _load_json(directory / "hf_quant_config.json")
    q = extra.get("quantization")
    if not isinstance(q, dict):
        return raw
    return {**raw, "quantization_config": {"quant_method": "modelopt", **q}}


def _layer_types(raw: dict[str, Any]) -> tuple[str, ...] | None:
    types = raw.get("layer_types")
    if types is not None:
        return tuple(str(t) for t in types)
    interval = raw.get("full_attention_interval")
    if interval:
        n = int(raw["num_hidden_layers"])
        return tuple("full_attention" if (i + 1) % int(interval) == 0 else "linear_attention" for i in range(n))
    return None


def _mlp_only_layers(raw: dict[str, Any]) -> tuple[int, ...]:
    """Layers with a dense MLP: ``mlp_only_layers`` (Qwen), or the "dense" entries of ``mlp_layer_types`` (GLM)."""
    dense = [int(i) for i in raw.get("mlp_only_layers", []) or []]
    dense += [i for i, t in enumerate(raw.get("mlp_layer_types") or []) if t == "dense"]
    return tuple(sorted(set(dense)))


def _sliding_window(raw: dict[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    if not window:
        return None
    if "use_sliding_window" in raw and not raw["use_sliding_window"]:
        return None
    return int(window)
