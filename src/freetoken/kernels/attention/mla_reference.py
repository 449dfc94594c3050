"""The torch reference of multi-head latent attention over paged latents (DeepSeek-V2/V3's MLA). The cache holds one
row per token: the normed compressed K/V ``c`` [R] and the rotated shared key ``kr`` [dr]. Head h's key is
``[W_UK[h] c, kr]`` and its value ``W_UV[h] c``, where kv_b_proj = [W_UK; W_UV] per head.

- decode (``mla_decode_reference``), absorbed as FlashInfer's and SGLang's MLA decode do: the query's no-rope part
  goes through ``W_UK`` first (``q_lat = W_UK[h]^T q_nope``), so every head attends over the latents themselves, MQA
  of head dim R + dr whose values are ``c``; the output ``o_lat`` [R] goes through ``W_UV`` after (the layer's
  part). Nothing per head is read from the pool.
- prefill (``mla_prefill_reference``): per sequence the context's latents are expanded to per-head K/V through
  kv_b_proj (cheaper than absorbing when many queries share the keys), a bounded key block at a time, and the
  blocks' attention merged by log-sum-exp.
Shapes: B sequences, T new tokens, H heads, R = kv_lora_rank, dr = qk_rope_head_dim, dn / dv no-rope key / value dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.kernels.attention.decode_reference import context_slots
from freetoken.kernels.attention.prefill_reference import rows_per_block

KV_BLOCK_ELEMENTS = 1 << 26  # expanded K/V values of one key block in prefill, all heads


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
    """Per sequence: its new tokens over the context before them, expanded a key block at a time (at most
    ``KV_BLOCK_ELEMENTS`` expanded K/V values: a long context never expands whole), and over themselves (causal),
    the parts merged exactly by their log-sum-exps."""
    T, H, dqk = q.shape
    dv = dims[1]
    out = q.new_empty((T, H, dv))
    S, table = meta.page_size, meta.block_table.long()
    block = max(1, KV_BLOCK_ELEMENTS // (H * (dqk + dv)))
    for s, (q0, n, ctx) in enumerate(zip(meta.q_start.tolist(), meta.q_len.tolist(), meta.ctx_len.tolist())):
        if n == 0:
            continue
        pos = torch.arange(ctx, device=q.device)
        lat = cache[table[s, pos // S] * S + pos % S, 0]  # [ctx, R + dr]
        qs = q[q0 : q0 + n].transpose(0, 1).to(kv_b.dtype)  # [H, n, dn + dr]
        before = ctx - n
        parts = [_attend(qs, *expand_latents(lat[k0 : min(k0 + block, before)], kv_b, dims), scale, False)
                 for k0 in range(0, before, block)]  # fmt: skip
        parts.append(_attend(qs, *expand_latents(lat[before:], kv_b, dims), scale, True))
        out[q0 : q0 + n] = merge_parts(parts).transpose(0, 1).to(q.dtype)
    return out


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [H, n, dqk] over k [H, m, dqk], v [H, m, dv] (causal: m == n, the same positions) -> (out [H, n, dv]
    float32, log-sum-exp [H, n] float32)."""
    return (attend_flash_cpu if q.device.type == "cpu" else attend_in_row_blocks)(q, k, v, scale, causal)


def attend_flash_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_attend`` through torch's CPU flash kernel, which wants one head dim: zero columns change no score and no
    output."""
    width, dv = max(q.shape[-1], v.shape[-1]), v.shape[-1]
    q4, k4, v4 = (F.pad(t, (0, width - t.shape[-1]))[None] for t in (q, k, v))
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q4, k4, v4, 0.0, causal, scale=scale)[:2]
    return o[0, ..., :dv].float(), lse[0].float()


def attend_in_row_blocks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_attend`` on any device, in float32, a block of query rows at a time (scores [H, rows, m] bounded)."""
    H, n, m = q.shape[0], q.shape[1], k.shape[1]
    out = q.new_empty((H, n, v.shape[-1]), dtype=torch.float32)
    lse = q.new_empty((H, n), dtype=torch.float32)
    kf, vf = k.float(), v.float()
    step = rows_per_block(H, m)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        sc = torch.matmul(q[:, r0:r1].float(), kf.transpose(1, 2)) * scale
        if causal:
            mask = torch.arange(m, device=q.device)[None, :] > torch.arange(r0, r1, device=q.device)[:, None]
            sc.masked_fill_(mask, float("-inf"))
        top = sc.amax(dim=-1, keepdim=True)
        p = torch.exp(sc - top)
        total = p.sum(dim=-1, keepdim=True)
        out[:, r0:r1] = torch.matmul(p, vf) / total
        lse[:, r0:r1] = (top + total.log())[..., 0]
    return out, lse


def merge_parts(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Exact softmax merge of attention over disjoint key sets: (out [H, n, d], lse [H, n]) each -> [H, n, d]."""
    if len(parts) == 1:
        return parts[0][0]
    lses = torch.stack([lse for _, lse in parts])  # [P, H, n]
    w = torch.exp(lses - lses.amax(dim=0, keepdim=True))
    return sum(o * wi[..., None] for (o, _), wi in zip(parts, w)) / w.sum(dim=0)[..., None]
