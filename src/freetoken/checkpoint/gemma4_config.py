"""Gemma-4's text config (``Gemma4TextConfig``, transformers 5.23) read into one typed view: what differs per layer
(sliding or full attention, head dim, KV heads, which earlier layer's KV a KV-shared layer reads) and the settings the
generic ``HFConfig`` has no field for. Pure (no torch): the memory sizes and the model's assembly both read it.

Per layer: full-attention layers take ``per_layer_config[i]``'s ``head_dim`` / ``num_key_value_heads`` (as saved by
transformers 5.23), or the older top-level ``global_head_dim`` (default 512) and ``num_global_key_value_heads`` (the
latter only under ``attention_k_eq_v``, as transformers reads it). KV sharing: the last ``num_kv_shared_layers`` layers
compute no K/V; each reads the KV of the last earlier non-shared layer of its own type (``kv_sharing_modes``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig, RopeConfig

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Gemma4Layer:
    kind: str  # SLIDING | FULL
    head_dim: int
    kv_heads: int
    k_eq_v: bool  # no v_proj: V is k_proj's output (full layers under ``attention_k_eq_v``)
    source: int  # the layer whose K/V it attends to: itself, or (KV-shared layers) an earlier one of its kind


@dataclass(frozen=True)
class Gemma4Config:
    layers: tuple[Gemma4Layer, ...]
    window: int
    rope: dict[str, RopeConfig]  # per kind
    moe: bool  # ``enable_moe_block``: every layer has the routed experts beside its dense MLP
    num_experts: int
    top_k: int
    moe_intermediate: int
    ple_dim: int  # ``hidden_size_per_layer_input`` (0: no per-layer input embeddings)
    ple_vocab: int
    softcap: float | None  # ``final_logit_softcapping``
    double_wide: bool  # ``use_double_wide_mlp``: KV-shared layers' dense MLP is twice as wide

    def kv_layers(self, kind: str) -> list[int]:
        """The layers of ``kind`` that compute and keep K/V (not KV-shared)."""
        return [i for i, lay in enumerate(self.layers) if lay.kind == kind and lay.source == i]


def _int(raw: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = raw.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int):
        raise CheckpointError(f"{where}: {key} is {v!r}; expected an integer")
    return v


def _rope(raw: dict[str, Any], kind: str, where: str) -> RopeConfig:
    params = (raw.get("rope_parameters") or {}).get(kind)
    defaults: dict[str, dict[str, Any]] = {
        SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    }
    params = params if isinstance(params, dict) else defaults[kind]
    rope_type = str(params.get("rope_type", "default"))
    if rope_type not in ("default", "proportional"):
        raise CheckpointError(f"{where}: rope_parameters.{kind}.rope_type is {rope_type!r}; supported: default, "
                              "proportional")  # fmt: skip
    extra = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type")}
    return RopeConfig(theta=float(params.get("rope_theta", 10_000.0)), kind=rope_type, params=extra)


def gemma4_config(hf: HFConfig) -> Gemma4Config:
    """The view of ``hf`` (a Gemma-4 config.json); what we do not run is refused naming its field."""
    raw, where = hf.raw, str(hf.path / "config.json")
    n = hf.num_layers
    if raw.get("use_bidirectional_attention") == "all":
        raise CheckpointError(f"{where}: use_bidirectional_attention 'all' (a non-causal model) is not supported")
    if raw.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"{where}: hidden_activation is {raw.get('hidden_activation')!r}; Gemma-4 has "
                              "gelu_pytorch_tanh")  # fmt: skip
    if raw.get("attention_bias"):
        raise CheckpointError(f"{where}: attention_bias true is not supported for Gemma-4")
    types = list(hf.layer_types or [SLIDING if (i + 1) % 6 else FULL for i in range(n)])
    if len(types) != n or any(t not in (SLIDING, FULL) for t in types):
        raise CheckpointError(f"{where}: layer_types must be {n} entries of {SLIDING!r} / {FULL!r}")
    types[-1] = FULL  # as transformers forces it
    k_eq_v = bool(raw.get("attention_k_eq_v", False))
    plc = raw.get("per_layer_config") or {}
    g_hd = raw.get("global_head_dim", 512)
    g_kv = raw.get("num_global_key_value_heads") if k_eq_v else None
    shared = _int(raw, "num_kv_shared_layers", where, 0)
    first_shared = n - shared
    if not 0 <= shared < n or (shared and set(types[:first_shared]) != set(types)):
        raise CheckpointError(f"{where}: num_kv_shared_layers {shared} leaves no earlier layer of every shared kind")
    layers = []
    for i, kind in enumerate(types):
        over = plc.get(str(i), plc.get(i, {})) if kind == FULL else {}
        if kind == FULL and not plc:
            over = {"head_dim": g_hd, **({"num_key_value_heads": g_kv} if g_kv is not None else {})}
        hd = _int({**raw, **over}, "head_dim", where)
        kvh = _int({**raw, **over}, "num_key_value_heads", where)
        source = i if i < first_shared else max(j for j in range(first_shared) if types[j] == kind)
        layers.append(Gemma4Layer(kind, hd, kvh, k_eq_v and kind == FULL, source))
    moe = bool(raw.get("enable_moe_block", False))
    ple = int(raw.get("hidden_size_per_layer_input") or 0)
    cap = raw.get("final_logit_softcapping")
    return Gemma4Config(
        layers=tuple(layers),
        window=_int(raw, "sliding_window", where, 512),
        rope={k: _rope(raw, k, where) for k in (SLIDING, FULL)},
        moe=moe,
        num_experts=_int(raw, "num_experts", where) if moe else 0,
        top_k=_int(raw, "top_k_experts", where) if moe else 0,
        moe_intermediate=_int(raw, "moe_intermediate_size", where) if moe else 0,
        ple_dim=ple,
        ple_vocab=_int(raw, "vocab_size_per_layer_input", where, hf.vocab_size) if ple else 0,
        softcap=float(cap) if cap else None,
        double_wide=bool(raw.get("use_double_wide_mlp", False)),
    )


def is_gemma4(hf: HFConfig) -> bool:
    return hf.architecture in ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
