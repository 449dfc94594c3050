"""The torch reference of multi-head latent attention over paged latents (DeepSeek-V2/V3's MLA). The cache holds one
row per token: the normed compressed K/V ``c`` [R] and the rotated shared key ``kr`` [dr]. Head h's key is
``[W_UK[h] c, kr]`` and its value ``W_UV[h] c``, where kv_b_proj = [W_UK; W_UV] per head.

- decode (``mla_decode_reference``), absorbed as FlashInfer's and SGLang's MLA decode do: the query's no-rope part
  goes through ``W_UK`` first (``q_lat = W_UK[h]^T q_nope``), so every head attends over the latents themselves, MQA
  of head dim R + dr whose values are ``c``; the output ``o_lat`` [R] goes through ``W_UV`` after (the layer's
  part). Nothing per head is read from the pool.
- prefill (``mla_prefill_reference``): per sequence the context's latents are expanded to per-head K/V through
  kv_b_proj (cheaper than absorbing when many queries share the keys), then the causal kernels of
  ``prefill_reference.py``.
Shapes: B sequences, T new tokens, H heads, R = kv_lora_rank, dr = qk_rope_head_dim, dn / dv no-rope key / value dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.kernels.attention.decode_reference import context_slots
from freetoken.kernels.attention.prefill_reference import causal_flash_cpu, causal_in_row_blocks


def mla_decode_reference(
    q: torch.Tensor,  # [B, H, R + dr]
    cache: torch.Tensor,  # [slots, 1, R + dr]
    meta: DecodeMeta,
    scale: float,
    rank: int,
) -> torch.Tensor:  # [B, H, R], q's dtype
    if meta.block_table.is_cuda:  # a graph's metadata is rewritten in place: nothing may be kept from it
        slots, valid = context_slots(meta, None)
    else:
        slots, valid = meta.gathered.get(None) or meta.gathered.setdefault(None, context_slots(meta, None))
    kv = cache[slots].float().transpose(1, 2)  # [B, 1, n, R + dr]
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None, :], kv, kv[..., :rank], attn_mask=valid[:, None, None, :], scale=scale, enable_gqa=True
    )  # [B, H, 1, R]
    return out[:, :, 0, :].to(q.dtype)


def expand_latents(lat: torch.Tensor, kv_b: torch.Tensor, dims: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """lat [n, R + dr] -> per-head keys [H, n, dn + dr] and values [H, n, dv] (kv_b [H * (dn + dv), R])."""
    dn, dv = dims
    rank = kv_b.shape[1]
    heads = kv_b.shape[0] // (dn + dv)
    c, kr = lat[:, :rank], lat[:, rank:]
    kv = F.linear(c.to(kv_b.dtype), kv_b).view(-1, heads, dn + dv).transpose(0, 1)  # [H, n, dn + dv]
    k = torch.cat((kv[..., :dn], kr.to(kv.dtype)[None].expand(heads, -1, -1)), dim=-1)
    return k, kv[..., dn:]


def mla_prefill_reference(
    q: torch.Tensor,  # [T, H, dn + dr]
    cache: torch.Tensor,  # [slots, 1, R + dr]
    kv_b: torch.Tensor,  # [H * (dn + dv), R]
    meta: PrefillMeta,
    scale: float,
    dims: tuple[int, int],  # (dn, dv)
) -> torch.Tensor:  # [T, H, dv], q's dtype
    T, H, dqk = q.shape
    dv = dims[1]
    out = q.new_empty((T, H, dv))
    S, table = meta.page_size, meta.block_table.long()
    width = max(dqk, dv)  # torch's CPU flash kernel wants one head dim: zero columns change no score or output
    for s, (q0, n, ctx) in enumerate(zip(meta.q_start.tolist(), meta.q_len.tolist(), meta.ctx_len.tolist())):
        if n == 0:
            continue
        pos = torch.arange(ctx, device=q.device)
        k, v = expand_latents(cache[table[s, pos // S] * S + pos % S, 0], kv_b, dims)
        qs = q[q0 : q0 + n].transpose(0, 1).to(k.dtype)  # [H, n, dn + dr]
        if q.device.type == "cpu":
            qs, k, v = (F.pad(t, (0, width - t.shape[-1])) for t in (qs, k, v))
            o = causal_flash_cpu(qs, k, v, scale)[..., :dv]
        else:
            o = causal_in_row_blocks(qs, k, v, scale, None)
        out[q0 : q0 + n] = o.transpose(0, 1).to(q.dtype)
    return out
