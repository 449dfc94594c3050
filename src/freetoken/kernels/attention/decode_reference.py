"""The torch reference of paged decode attention: gather each sequence's K/V through its page table
(one gather for the whole batch, padded to the longest context), SDPA with the padding masked, in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.sinks import sdpa_with_sinks


def paged_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: DecodeMeta,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,  # [H] float32: a sink logit per head (gpt-oss)
) -> torch.Tensor:
    B, H, hd = q.shape
    hkv = k_cache.shape[1]
    if meta.block_table.is_cuda:  # a graph's metadata is rewritten in place: nothing may be kept from it
        slots, valid = context_slots(meta, window)
    else:
        slots, valid = meta.gathered.get(window) or meta.gathered.setdefault(window, context_slots(meta, window))
    k = k_cache[slots].float().transpose(1, 2)  # [B, Hkv, n, hd]
    v = v_cache[slots].float().transpose(1, 2)
    if sinks is not None:
        return sdpa_with_sinks(q[:, :, None, :], k, v, valid[:, None, None, :], scale, sinks)[:, :, 0, :].to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None, :], k, v, attn_mask=valid[:, None, None, :], scale=scale, enable_gqa=H != hkv
    )  # [B, H, 1, hd]: one call instead of two einsums, a mask and a softmax (the CPU decode step's hot spot)
    return out[:, :, 0, :].to(q.dtype)


def context_slots(meta: DecodeMeta, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's context slots [B, n] through its page table (0 where masked) and the mask [B, n]."""
    S = meta.page_size
    n = meta.block_table.shape[1] * S  # positions 0..n-1 the page table can address
    pos = torch.arange(n, device=meta.block_table.device)
    slots = meta.block_table.long()[:, pos // S] * S + pos % S
    lens = meta.seq_lens.long()[:, None]
    valid = pos[None, :] < lens
    if window is not None:
        valid &= pos[None, :] >= lens - window
    return torch.where(valid, slots, torch.zeros_like(slots)), valid
