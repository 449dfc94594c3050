"""Multi-head latent attention's block (``layers/mla.py``), read from a checkpoint by a family's names: the q path
(``q_a_proj`` + ``q_a_layernorm`` + ``q_b_proj``, or ``q_proj`` when ``q_lora_rank`` is null), ``kv_a_proj_with_mqa``,
``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``. Shapes are checked against the config naming the field that disagrees;
DeepSeek's interleaved rotary layout (``rope_interleave``) becomes rotate-half by permuting the rope rows; the softmax
scale carries YaRN's ``mscale_all_dim`` correction as transformers applies it. A family without rotary
(``Family.mla_rope`` off: Kimi-Linear) keeps its rows as they are and the plain scale."""

from __future__ import annotations

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.layers.dsa import DSAttention
from freetoken.layers.mla import MLADims, MLAttention, MLAWeights
from freetoken.layers.rope import Rotary, yarn_mscale
from freetoken.models.base import Family
from freetoken.models.dsa_blocks import dsa_fields, indexer_kinds, indexer_weights

LATENT_NORM_EPS = 1e-6  # q_a_layernorm, kv_a_layernorm: transformers builds them with the default eps


def _field(hf: HFConfig, key: str) -> int:
    value = hf.raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(f"{hf.path / 'config.json'}: MLA field {key!r} must be a positive integer, not {value!r}")
    return value


def mla_dims(hf: HFConfig) -> MLADims:
    return MLADims(hf.num_heads, _field(hf, "kv_lora_rank"), _field(hf, "qk_rope_head_dim"),
                   _field(hf, "qk_nope_head_dim"), _field(hf, "v_head_dim"))  # fmt: skip


def mla_scale(hf: HFConfig, dims: MLADims) -> float:
    """(dn + dr)^-0.5, times mscale(factor, mscale_all_dim)^2 under a scaled rotary (transformers' rule)."""
    scale = float((dims.nope_dim + dims.rope_dim) ** -0.5)
    p = hf.rope.params
    if hf.rope.kind != "default" and p.get("mscale_all_dim"):
        m = yarn_mscale(float(p["factor"]), float(p["mscale_all_dim"]))
        scale *= m * m
    return scale


def _check_rows(w: CheckpointWeights, name: str, rows: int, what: str, hf: HFConfig) -> None:
    """A projection's output rows against the config's, naming the fields (refused before the generic shape check)."""
    if name in w and w.reader.shape(name)[0] != rows:
        got = w.reader.shape(name)[0]
        raise CheckpointError(f"{w.reader.directory}: tensor {name} has {got} rows but config.json's {what} = {rows} "
                              f"({hf.architecture})")  # fmt: skip


def mla_attention(
    w: CheckpointWeights, fam: Family, hf: HFConfig, i: int, kv_index: int, rotary: Rotary
) -> MLAttention:
    p = fam.naming.layer.format(i=i) + fam.naming.attn
    if fam.attention == "dsa":
        dsa_fields(hf)  # before the q path: DSA needs the q LoRA
    d = mla_dims(hf)
    D, H, R, dr, dn, dv = hf.hidden_size, d.heads, d.rank, d.rope_dim, d.nope_dim, d.v_dim
    bias = hf.attention_bias
    q_rows = "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)"
    _check_rows(w, p + ("q_b_proj.weight" if hf.raw.get("q_lora_rank") else "q_proj.weight"), H * (dn + dr), q_rows, hf)
    _check_rows(w, p + "kv_a_proj_with_mqa.weight", R + dr, "kv_lora_rank + qk_rope_head_dim", hf)
    _check_rows(w, p + "kv_b_proj.weight", H * (dn + dv), "num_attention_heads x (qk_nope_head_dim + v_head_dim)", hf)
    q_lora = hf.raw.get("q_lora_rank")
    q = q_a = q_a_norm = q_b = q_a_bias = None
    if q_lora:
        ql = _field(hf, "q_lora_rank")
        q_a = w.get(p + "q_a_proj.weight", (ql, D))
        q_a_bias = w.get(p + "q_a_proj.bias", (ql,)) if bias else None
        q_a_norm = w.get(p + "q_a_layernorm.weight", (ql,))
        q_b = w.get(p + "q_b_proj.weight", (H * (dn + dr), ql))
    else:
        q = w.get(p + "q_proj.weight", (H * (dn + dr), D))
    kv_a = w.get(p + "kv_a_proj_with_mqa.weight", (R + dr, D))
    kv_a_bias = w.get(p + "kv_a_proj_with_mqa.bias", (R + dr,)) if bias else None
    if not fam.mla_rope and hf.raw.get("mla_use_nope", True) is not True:
        raise CheckpointError(f"{hf.path / 'config.json'}: mla_use_nope {hf.raw['mla_use_nope']!r}: {hf.architecture} "
                              f"is implemented with NoPE latent attention only (as transformers does)")  # fmt: skip
    if fam.mla_rope and hf.raw.get("rope_interleave", True):  # transformers' default for both MLA families
        perm = torch.cat((torch.arange(0, dr, 2), torch.arange(1, dr, 2))).to(kv_a.device)
        kv_a = torch.cat((kv_a[:R], kv_a[R:][perm]))
        kv_a_bias = None if kv_a_bias is None else torch.cat((kv_a_bias[:R], kv_a_bias[R:][perm]))
        head_perm = torch.cat((torch.arange(dn), dn + perm.cpu()))  # one head's rows: no-rope, then rope
        rows = (torch.arange(H)[:, None] * (dn + dr) + head_perm[None, :]).reshape(-1).to(kv_a.device)
        q, q_b = (None if t is None else t[rows].contiguous() for t in (q, q_b))
    mw = MLAWeights(
        kv_a=kv_a,
        kv_a_norm=w.get(p + "kv_a_layernorm.weight", (R,)),
        kv_b=w.get(p + "kv_b_proj.weight", (H * (dn + dv), R)),
        o=w.get(p + "o_proj.weight", (D, H * dv)),
        q=q, q_a=q_a, q_a_norm=q_a_norm, q_b=q_b, q_a_bias=q_a_bias, kv_a_bias=kv_a_bias,
        o_bias=w.get(p + "o_proj.bias", (D,)) if bias else None,
    )  # fmt: skip
    if fam.attention == "dsa":
        kinds = indexer_kinds(hf, fam)
        source = max(j for j in range(i + 1) if kinds[j] == "full")  # the selection this layer attends by
        idx = indexer_weights(w, fam, hf, i, dr) if source == i else None
        return DSAttention(mw, kv_index, d, LATENT_NORM_EPS, rotary, mla_scale(hf, d), idx, kv_index - (i - source),
                           dsa_fields(hf)[1])  # fmt: skip
    if not fam.mla_rope:  # NoPE: the plain softmax scale, whatever rotary settings the config carries
        return MLAttention(mw, kv_index, d, LATENT_NORM_EPS, rotary, float((dn + dr) ** -0.5), rope=False)
    return MLAttention(mw, kv_index, d, LATENT_NORM_EPS, rotary, mla_scale(hf, d))
