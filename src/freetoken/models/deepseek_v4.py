"""DeepSeek-V4 (``DeepseekV4ForCausalLM``, transformers' ``deepseek_v4``): its switches from config.json, checked at
load. Names and block reads: ``deepseek_v4_blocks.py``; the decoder over residual streams: ``deepseek_v4_decoder.py``;
attention and compressors: ``layers/v4_attention.py``, ``layers/v4_compressor.py``; routing: ``layers/v4_moe.py``.

Per layer an attention kind (``layer_types``: ``sliding_attention``, ``compressed_sparse_attention`` at rate m with a
lightning indexer, ``heavily_compressed_attention`` at rate m'; older configs: ``compress_ratios`` 0 / 4 / 128, rates
``compress_rate_csa`` / ``compress_rate_hca``) and a MoE kind (``mlp_layer_types``: ``hash_moe`` routes by token id,
``moe`` by score; older configs: the first ``num_hash_layers``); ``hc_mult`` residual streams. Rope: ``main``
(``rope_theta``, plain) on sliding layers, ``compress`` (``compress_rope_theta``, ``rope_parameters``' scaling,
YaRN without its magnitude scale) on the others, on the last ``qk_rope_head_dim`` channels of a head.
The multi-token-prediction block (``mtp.*``) is not used: skipped at load, said once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freetoken.checkpoint.dsv4_config import CSA, compress_rates, layer_kinds
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig, RopeConfig
from freetoken.experts.reference import DSV4_LIMIT
from freetoken.layers.v4_moe import SCORING
from freetoken.models.base import Family, Naming
from freetoken.quant.base import QuantizationError
from freetoken.quant.dsv4_layout import Dsv4Layout, layout_from_config

FAMILY = Family(
    architectures=("DeepseekV4ForCausalLM",),
    naming=Naming(shared_expert="shared_experts."),
    build="freetoken.loader.deepseek_v4_build",
)
ACTIVATION = "dsv4"  # the routed experts' clamped SiLU by its kernel name (``experts/reference.py``)
MLP_KINDS = ("hash_moe", "moe")


@dataclass(frozen=True)
class V4Config:
    kinds: tuple[str, ...]  # attention kind per layer
    hash_layers: tuple[bool, ...]  # routed by token id, per layer
    rates: dict[str, int]  # compression rate per compressed kind
    streams: int  # hc_mult
    sinkhorn_iters: int
    hc_eps: float
    rot: int  # qk_rope_head_dim
    window: int
    groups: int  # o_groups
    o_rank: int  # o_lora_rank
    q_rank: int  # q_lora_rank
    index_heads: int
    index_dim: int
    index_topk: int
    scoring: str
    scale: float  # routed_scaling_factor
    main_rope: RopeConfig
    compress_rope: RopeConfig


def _int(hf: HFConfig, key: str, default: Any = None, low: int = 1) -> int:
    v = hf.raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise CheckpointError(f"{hf.path / 'config.json'}: {key} is {v!r}; expected an integer >= {low}")
    return v


def _fail(hf: HFConfig, msg: str) -> CheckpointError:
    return CheckpointError(f"{hf.path / 'config.json'}: {msg}")


def _hash_layers(hf: HFConfig) -> tuple[bool, ...]:
    n = hf.num_layers
    types = hf.raw.get("mlp_layer_types")
    if types is None:
        k = hf.raw.get("num_hash_layers", 3)
        types = ["hash_moe"] * min(n, int(k)) + ["moe"] * max(0, n - int(k))
    types = list(types)[:n]
    if len(types) != n or any(t not in MLP_KINDS for t in types):
        raise _fail(hf, f"mlp_layer_types must name {n} layers among {MLP_KINDS}; got {types}")
    return tuple(t == "hash_moe" for t in types)


def _ropes(hf: HFConfig, rot: int) -> tuple[RopeConfig, RopeConfig]:
    rp = hf.raw.get("rope_parameters") or hf.raw.get("rope_scaling") or {}
    theta = float(hf.raw.get("rope_theta", 10000.0))
    if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        main, comp = rp["main"], rp["compress"]
    else:
        main = {"rope_type": "default", "rope_theta": theta}
        comp = {**{k: v for k, v in rp.items() if k not in ("main", "compress")},
                "rope_theta": float(hf.raw.get("compress_rope_theta", 160000.0))}  # fmt: skip
    out = []
    for p in (main, comp):
        kind = str(p.get("rope_type", p.get("type", "default")) or "default")
        extra = {k: v for k, v in p.items() if k not in ("rope_theta", "rope_type", "type", "partial_rotary_factor")}
        if kind == "yarn":
            extra.setdefault("attention_factor", 1.0)  # V4 does not scale cos/sin by YaRN's magnitude
        if kind not in ("default", "yarn", "linear", "llama3"):
            raise _fail(hf, f"rope type {kind!r} is not supported (default, linear, llama3, yarn)")
        out.append(RopeConfig(float(p.get("rope_theta", theta)), kind, extra))
    return out[0], out[1]


def checkpoint_layout(hf: HFConfig) -> Dsv4Layout | None:
    """The release's quantisation (``quant/dsv4_layout.py``: FP8 weights, MXFP4 routed experts), None for a float
    checkpoint; anything else refused naming the field."""
    try:
        return layout_from_config(hf.raw)
    except QuantizationError as exc:
        raise _fail(hf, str(exc)) from exc


def v4_config(hf: HFConfig) -> V4Config:
    """The switches, each refused by name where the engine does not implement it."""
    raw = hf.raw
    if hf.num_kv_heads != 1:
        raise _fail(hf, f"num_key_value_heads is {hf.num_kv_heads}; DeepSeek-V4 shares one KV head")
    limit = raw.get("swiglu_limit", DSV4_LIMIT)
    if not isinstance(limit, (int, float)) or abs(float(limit) - DSV4_LIMIT) > 1e-6:
        raise _fail(hf, f"swiglu_limit is {limit!r}; the expert kernels implement DeepSeek-V4's {DSV4_LIMIT}")
    scoring = str(raw.get("scoring_func", "sqrtsoftplus"))
    if scoring not in SCORING:
        raise _fail(hf, f"scoring_func {scoring!r} is not supported ({', '.join(SCORING)})")
    prf = raw.get("partial_rotary_factor")
    rot = int(raw["qk_rope_head_dim"]) if raw.get("qk_rope_head_dim") else int(hf.head_dim * float(prf or 64 / 512))
    if rot < 2 or rot % 2 or rot > hf.head_dim:
        raise _fail(hf, f"qk_rope_head_dim {rot} must be even and within head_dim {hf.head_dim}")
    kinds, groups = layer_kinds(hf), _int(hf, "o_groups", 8)
    if hf.num_heads % groups:
        raise _fail(hf, f"o_groups {groups} does not divide num_attention_heads {hf.num_heads}")
    index_dim = _int(hf, "index_head_dim", 128) if CSA in kinds else 0
    if CSA in kinds and index_dim < rot:
        raise _fail(hf, f"index_head_dim {index_dim} is narrower than qk_rope_head_dim {rot}")
    main, comp = _ropes(hf, rot)
    return V4Config(
        kinds=kinds, hash_layers=_hash_layers(hf), rates=compress_rates(hf), streams=_int(hf, "hc_mult", 4),
        sinkhorn_iters=_int(hf, "hc_sinkhorn_iters", 20), hc_eps=float(raw.get("hc_eps", 1e-6)), rot=rot,
        window=_int(hf, "sliding_window", 128), groups=groups, o_rank=_int(hf, "o_lora_rank", 1024),
        q_rank=_int(hf, "q_lora_rank", 1024), index_heads=_int(hf, "index_n_heads", 64) if CSA in kinds else 0,
        index_dim=index_dim, index_topk=_int(hf, "index_topk", 512) if CSA in kinds else 0, scoring=scoring,
        scale=float(raw.get("routed_scaling_factor", 1.0)), main_rope=main, compress_rope=comp,
    )  # fmt: skip
