"""DSA decode on CUDA: the indexer's scores and top-k in torch on the device (``dsa_reference.selected_slots``, no
host sync), then MLA's Triton absorbed decode (``mla_triton_decode.py``) over the kept latents only - the kept slots
are a page table of page size 1 whose lengths are min(index_topk, context), so the kernel reads K rows per sequence
whatever the context. The cache rows' indexer keys past the latent are skipped by a view."""

from __future__ import annotations

import torch

from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.dsa_reference import selected_slots
from freetoken.kernels.attention.mla_triton_decode import mla_decode_triton


def dsa_decode_triton(
    q: torch.Tensor,  # [B, H, L] the absorbed query, L = R + dr
    cache: torch.Tensor,  # [slots, 1, L + Di]
    meta: DecodeMeta,
    scale: float,
    rank: int,
    iq: torch.Tensor,  # [B, Hi, Di]
    iw: torch.Tensor,  # [B, Hi]
    topk: int,
    splits: int | None = None,
) -> torch.Tensor:  # [B, H, R], q's dtype
    L = q.shape[-1]
    sel, counts = selected_slots(cache, meta, L, iq, iw, topk)
    return mla_decode_triton(q, cache[..., :L], DecodeMeta(sel, counts, 1), scale, rank, splits)
