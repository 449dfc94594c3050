"""Configs that name the usual fields their own way, read into the names ``hf_config.py`` and the families read.

Kimi-Linear (``model_type`` "kimi_linear"): its checkpoints' config.json, and transformers' ``save_pretrained``,
spell ``num_experts_per_token``, ``moe_renormalize``, ``num_expert_group``, ``num_shared_experts``,
``model_max_length`` and ``moe_router_activation_func`` (transformers' ``attribute_map``); its linear-attention dims
sit in ``linear_attn_config`` (``head_dim``, ``num_heads``, ``short_conv_kernel_size``, winning over the top-level
``linear_*`` fields) and become the gated-DeltaNet dims (keys and values alike); which layers are KDA and which full
attention comes from ``layer_types``, else from ``linear_attn_config``'s ``kda_layers`` / ``full_attn_layers``
(1-indexed), else transformers' default (full attention where i > 0 and i % 4 == 0); which are dense from
``mlp_layer_types``, else the first ``first_k_dense_replace`` (1 when unsaid). A list that leaves a layer out, names
one twice or names one past the last is refused here, naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from freetoken.checkpoint.errors import CheckpointError

KIMI_LINEAR_ALIASES = {
    "num_experts_per_token": "num_experts_per_tok",
    "moe_renormalize": "norm_topk_prob",
    "num_expert_group": "n_group",
    "num_shared_experts": "n_shared_experts",
    "model_max_length": "max_position_embeddings",
    "moe_router_activation_func": "scoring_func",
}
FULL, LINEAR = "full_attention", "linear_attention"


def normalise(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """``raw`` with the usual names filled in (a new dict; configs that need nothing come back as they are)."""
    if raw.get("model_type") != "kimi_linear":
        return raw
    out = dict(raw)
    for theirs, ours in KIMI_LINEAR_ALIASES.items():
        if theirs in raw and ours not in raw:
            out[ours] = raw[theirs]
    lin = raw.get("linear_attn_config") or {}
    if not isinstance(lin, dict):
        raise CheckpointError(f"{path}: linear_attn_config must be an object")
    heads = lin.get("num_heads", raw.get("linear_num_heads", 32))
    head_dim = lin.get("head_dim", raw.get("linear_head_dim", 128))
    out["linear_num_key_heads"] = out["linear_num_value_heads"] = heads
    out["linear_key_head_dim"] = out["linear_value_head_dim"] = head_dim
    out["linear_conv_kernel_dim"] = lin.get("short_conv_kernel_size", raw.get("linear_conv_kernel_dim", 4))
    n = int(raw["num_hidden_layers"]) if isinstance(raw.get("num_hidden_layers"), int) else 0
    if raw.get("layer_types") is None:
        out["layer_types"] = _layer_types(lin, n, path)
    if raw.get("mlp_layer_types") is None:
        k = raw.get("first_k_dense_replace", 1)
        if isinstance(k, bool) or not isinstance(k, int):
            raise CheckpointError(f"{path}: first_k_dense_replace must be an integer, got {k!r}")
        out["mlp_layer_types"] = ["dense" if i < k else "sparse" for i in range(n)]
    kinds = out["mlp_layer_types"]
    if not isinstance(kinds, list) or len(kinds) != n or any(t not in ("dense", "sparse") for t in kinds):
        raise CheckpointError(f"{path}: mlp_layer_types must list 'dense' or 'sparse' for each of the {n} layers")
    out["first_k_dense_replace"] = 0  # mlp_layer_types alone says which layers are dense (as transformers reads it)
    return out


def _layer_types(lin: dict[str, Any], n: int, path: Path) -> list[str]:
    if "full_attn_layers" not in lin or "kda_layers" not in lin:
        return [FULL if i and i % 4 == 0 else LINEAR for i in range(n)]
    kinds: list[str | None] = [None] * n
    for key, kind in (("full_attn_layers", FULL), ("kda_layers", LINEAR)):
        for layer in lin[key] or []:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= n:
                raise CheckpointError(f"{path}: linear_attn_config.{key} names layer {layer!r}; layers are numbered "
                                      f"1 to {n} there")  # fmt: skip
            if kinds[layer - 1] is not None:
                raise CheckpointError(f"{path}: linear_attn_config names layer {layer} twice")
            kinds[layer - 1] = kind
    missing = [i + 1 for i, k in enumerate(kinds) if k is None]
    if missing:
        raise CheckpointError(f"{path}: linear_attn_config puts layer {missing[0]} (1-indexed) in neither "
                              f"full_attn_layers nor kda_layers")  # fmt: skip
    return [str(k) for k in kinds]
