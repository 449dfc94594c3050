"""The hybrid families' blocks, read by a family's names: which token mixer each layer has (``layer_types``), the
gated DeltaNet layers' weights in one layout, the gated attention's query/gate split, the recurrent state's shape."""

from __future__ import annotations

import torch

from freetoken.cache.state_pool import StateShape
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.layers.deltanet import DeltaNetWeights, GatedDeltaNet
from freetoken.models.base import Family
from freetoken.models.kda_blocks import kda

FULL, LINEAR, SLIDING = "full_attention", "linear_attention", "sliding_attention"


def layer_kinds(hf: HFConfig, family: Family) -> list[str]:
    """Each layer's token mixer; a hybrid family's unknown kind is refused, naming it. SLIDING: a window layer whose KV
    is a ring in the state pool (families with ``window_ring``); others' window layers are FULL (masked pages)."""
    if family.deltanet_proj is None:
        if family.window_ring and hf.layer_types is not None and hf.sliding_window:
            if len(hf.layer_types) != hf.num_layers:
                raise CheckpointError(f"{hf.path / 'config.json'}: layer_types has {len(hf.layer_types)} entries for "
                                      f"{hf.num_layers} layers")  # fmt: skip
            return [SLIDING if k == SLIDING else FULL for k in hf.layer_types]
        return [FULL] * hf.num_layers
    n, every = hf.num_layers, family.full_attention_interval
    kinds = list(hf.layer_types) if hf.layer_types is not None else [
        FULL if (i + 1) % every == 0 else LINEAR for i in range(n)
    ]
    where = hf.path / "config.json"
    if len(kinds) != n:
        raise CheckpointError(f"{where}: layer_types has {len(kinds)} entries for {n} layers")
    for i, kind in enumerate(kinds):
        if kind not in (FULL, LINEAR):
            raise CheckpointError(f"{where}: layer_types[{i}] is {kind!r}, a layer type {hf.architecture} does not "
                                  f"have (supported: {FULL}, {LINEAR})")  # fmt: skip
    return kinds


def _dims(hf: HFConfig) -> tuple[int, int, int, int, int]:
    r = hf.raw
    try:
        hk, h = int(r["linear_num_key_heads"]), int(r["linear_num_value_heads"])
        dk, dv, K = int(r["linear_key_head_dim"]), int(r["linear_value_head_dim"]), int(r["linear_conv_kernel_dim"])
    except KeyError as e:
        raise CheckpointError(f"{hf.path / 'config.json'}: required field {e.args[0]!r} is missing") from None
    if h % hk:
        raise CheckpointError(f"{hf.path / 'config.json'}: {h} linear value heads over {hk} key heads")
    return hk, h, dk, dv, K


def state_shape(hf: HFConfig, num_linear: int, num_rings: int = 0) -> StateShape:
    """A request's state: its linear-attention layers' conv and delta-rule states, its window layers' KV rings."""
    hk, h, dk, dv, K = _dims(hf) if num_linear else (0, 0, 0, 0, 1)
    ring = (num_rings, int(hf.sliding_window or 0), hf.num_kv_heads, hf.head_dim) if num_rings else (0, 0, 0, 0)
    return StateShape(num_linear, 2 * hk * dk + h * dv, K - 1, h, dk, dv, *ring)


def deltanet(w: CheckpointWeights, family: Family, hf: HFConfig, i: int, li: int) -> GatedDeltaNet:
    """Layer i's gated DeltaNet, the ``li``-th linear-attention layer (its state pool index); KDA where the family
    has it (``models/kda_blocks.py``)."""
    if family.deltanet_proj == "kda":
        return kda(w, family, hf, i, li)
    p = family.naming.layer.format(i=i) + family.naming.linear_attn
    D = hf.hidden_size
    hk, h, dk, dv, K = _dims(hf)
    C = 2 * hk * dk + h * dv
    if family.deltanet_proj == "qkvz":  # per key head: q, k, then its value heads' v and z; b/a likewise
        rep = h // hk
        qkvz = w.get(p + "in_proj_qkvz.weight", (2 * hk * dk + 2 * h * dv, D)).view(hk, 2 * dk + 2 * rep * dv, D)
        q, k, v, z = qkvz.split([dk, dk, rep * dv, rep * dv], dim=1)
        ba = w.get(p + "in_proj_ba.weight", (2 * h, D)).view(hk, 2 * rep, D)
        b, a = ba.split([rep, rep], dim=1)
        parts = [t.reshape(-1, D) for t in (q, k, v, z, b, a)]
    else:
        parts = [w.get(p + "in_proj_qkv.weight", (C, D)), w.get(p + "in_proj_z.weight", (h * dv, D)),
                 w.get(p + "in_proj_b.weight", (h, D)), w.get(p + "in_proj_a.weight", (h, D))]  # fmt: skip
    dw = DeltaNetWeights(
        in_proj=torch.cat(parts, dim=0).contiguous(),
        conv=w.get(p + "conv1d.weight", (C, 1, K)).reshape(C, K).contiguous(),
        A_log=w.get(p + "A_log", (h,)).float(),
        dt_bias=w.get(p + "dt_bias", (h,)).float(),
        norm=w.get(p + "norm.weight", (dv,)),
        out=w.get(p + "out_proj.weight", (D, h * dv)),
    )
    return GatedDeltaNet(dw, li, hk, h, dk, dv, hf.rms_eps)


def split_gated_q(q: torch.Tensor, heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A gated attention's q_proj rows [H*2*hd, ...] (per head: hd query rows, then hd gate rows) -> query rows and
    gate rows, [H*hd, ...] each."""
    v = q.view(heads, 2, head_dim, *q.shape[1:])
    return v[:, 0].reshape(heads * head_dim, *q.shape[1:]).contiguous(), v[:, 1].reshape(
        heads * head_dim, *q.shape[1:]
    ).contiguous()
