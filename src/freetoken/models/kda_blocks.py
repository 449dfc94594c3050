"""Kimi Delta Attention's block (``layers/kda.py``), read from a checkpoint by a family's names, as Kimi-Linear ships
it (and transformers saves it): ``q_proj``, ``k_proj``, ``v_proj``; one depthwise conv per projection
(``q_conv1d``, ``k_conv1d``, ``v_conv1d``, [H*dk, 1, K], no bias), stacked into one conv over the q/k/v channels;
the forget gate ``f_a_proj`` [dk, D], ``f_b_proj`` [H*dk, dk], ``dt_bias`` [H*dk], ``A_log`` [1, 1, H, 1]; ``b_proj``
[H, D]; the output gate ``g_a_proj``, ``g_b_proj``; ``o_norm`` [dk]; ``o_proj``. Dims from the config's
``linear_*`` fields (``checkpoint/config_aliases.py`` reads ``linear_attn_config`` into them)."""

from __future__ import annotations

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.layers.kda import KDAWeights, KimiDeltaAttention
from freetoken.models.base import Family


def kda_dims(hf: HFConfig) -> tuple[int, int, int]:
    """(heads, head dim, conv kernel), checked: KDA's keys and values share heads and head dim."""
    r, where = hf.raw, hf.path / "config.json"
    try:
        h, dk, K = int(r["linear_num_value_heads"]), int(r["linear_key_head_dim"]), int(r["linear_conv_kernel_dim"])
        hk, dv = int(r["linear_num_key_heads"]), int(r["linear_value_head_dim"])
    except KeyError as e:
        raise CheckpointError(f"{where}: required field {e.args[0]!r} is missing") from None
    if (hk, dv) != (h, dk) or min(h, dk, K) < 1 or K < 2:
        raise CheckpointError(f"{where}: KDA needs as many key as value heads of one head dim and a conv kernel of at "
                              f"least 2, got {hk}/{h} heads of {dk}/{dv}, kernel {K}")  # fmt: skip
    act = r.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{where}: hidden_act {act!r} is not implemented for {hf.architecture} (supported: silu)")
    return h, dk, K


def kda(w: CheckpointWeights, family: Family, hf: HFConfig, i: int, li: int) -> KimiDeltaAttention:
    """Layer i's KDA, the ``li``-th linear-attention layer (its state pool index)."""
    p = family.naming.layer.format(i=i) + family.naming.linear_attn
    H, d, K = kda_dims(hf)
    D, HD = hf.hidden_size, H * d
    projections = [w.get(p + f"{x}_proj.weight", (HD, D)) for x in "qkv"]
    projections += [w.get(p + "f_a_proj.weight", (d, D)), w.get(p + "g_a_proj.weight", (d, D)),
                    w.get(p + "b_proj.weight", (H, D))]  # fmt: skip
    conv = [w.get(p + f"{x}_conv1d.weight", (HD, 1, K)).reshape(HD, K) for x in "qkv"]
    kw = KDAWeights(
        in_proj=torch.cat(projections, dim=0).contiguous(),
        conv=torch.cat(conv, dim=0).contiguous(),
        A_log=w.get(p + "A_log", (1, 1, H, 1), torch.float32).reshape(H),
        dt_bias=w.get(p + "dt_bias", (HD,), torch.float32),
        norm=w.get(p + "o_norm.weight", (d,)),
        out=w.get(p + "o_proj.weight", (D, HD)),
        f_b=w.get(p + "f_b_proj.weight", (HD, d)),
        g_b=w.get(p + "g_b_proj.weight", (HD, d)),
    )
    return KimiDeltaAttention(kw, li, H, d, hf.rms_eps)
