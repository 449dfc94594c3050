"""DSA decode on CUDA: the indexer's selection (``decode_selection_triton``: the scores in Triton,
``index_triton.py``, their top-k in torch on the device, no host sync; ``dsa_reference.decode_selection`` is its
reference) is a page table of page size 1 whose lengths are min(index_topk, context), and MLA's Triton absorbed decode
(``mla_triton_decode.py``) runs over those kept latents only, so it reads at most K rows per sequence whatever the
context. The cache rows' indexer keys past the latent are skipped by a view."""

from __future__ import annotations

import torch

from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.index_triton import index_scores_paged
from freetoken.kernels.attention.mla_triton_decode import mla_decode_triton


def decode_selection_triton(
    cache: torch.Tensor, meta: DecodeMeta, width: int, iq: torch.Tensor, iw: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dsa_reference.decode_selection`` with the scores in Triton: kept cache slots [B, K] best first (entries past
    a sequence's count are not slots) and the counts [B] int32."""
    S = meta.page_size
    scores = index_scores_paged(iq, iw, cache[:, 0, width:], meta.block_table, meta.seq_lens, S)
    k = min(topk, scores.shape[-1])
    idx = scores.topk(k, dim=-1).indices  # the visible positions first (the others score -inf)
    slots = meta.block_table.long().gather(1, torch.div(idx, S, rounding_mode="floor")) * S + torch.remainder(idx, S)
    return slots, meta.seq_lens.clamp(max=k).to(torch.int32)


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
