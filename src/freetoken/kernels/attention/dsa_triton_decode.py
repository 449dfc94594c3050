"""DSA decode on CUDA: MLA's Triton absorbed decode (``mla_triton_decode.py``) over the kept latents only. The
indexer's selection (``dsa_reference.decode_selection``: scores and top-k in torch on the device, no host sync) is
a page table of page size 1 whose lengths are min(index_topk, context), so the kernel reads at most K rows per
sequence whatever the context. The cache rows' indexer keys past the latent are skipped by a view."""

from __future__ import annotations

import torch

from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.mla_triton_decode import mla_decode_triton


def dsa_decode_triton(
    q: torch.Tensor,  # [B, H, L] the absorbed query, L = R + dr
    cache: torch.Tensor,  # [slots, 1, L + Di]
    selection: tuple[torch.Tensor, torch.Tensor],  # kept slots [B, K], counts [B]
    scale: float,
    rank: int,
    splits: int | None = None,
) -> torch.Tensor:  # [B, H, R], q's dtype
    sel, counts = selection
    return mla_decode_triton(q, cache[..., : q.shape[-1]], DecodeMeta(sel, counts, 1), scale, rank, splits)
