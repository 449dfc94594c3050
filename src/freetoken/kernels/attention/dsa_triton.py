"""DSA on CUDA (``dsa_reference.py`` is the reference of each function here).

- Decode: the indexer's selection (``decode_selection_triton``: the scores in Triton, ``index_triton.py``, their
  top-k in torch on the device, no host sync) is a page table of page size 1 whose lengths are min(index_topk,
  context), and MLA's Triton absorbed decode (``mla_triton_decode.py``) runs over those kept latents only, so it reads
  at most K rows per sequence whatever the context.
- Prefill: each new token is a decode row of its own. Its scores come from the same kernel (the sequence's page
  table for every row, each row seeing the positions up to its own), so a block of rows holds only its [rows, ctx]
  float32 scores, not the torch path's [rows, Hi, ctx] products: blocks ``Hi`` times larger. Its kept positions
  (the visible ones first) are its page-size-1 table, and the same MLA decode kernel attends over them, a block of
  rows at a time.
The cache rows' indexer keys past the latent are skipped by a view.
"""

from __future__ import annotations

import torch

from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.kernels.attention.dsa_reference import ELEMENTS, PrefillBlock
from freetoken.kernels.attention.index_triton import index_scores_paged
from freetoken.kernels.attention.mla_triton_decode import mla_decode_triton


def decode_selection_triton(
    cache: torch.Tensor, meta: DecodeMeta, width: int, iq: torch.Tensor, iw: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``decode_selection`` with the scores in Triton: kept cache slots [B, K] best first (entries past a sequence's
    count are not slots) and the counts [B] int32."""
    S = meta.page_size
    scores = index_scores_paged(iq, iw, cache[:, 0, width:], meta.block_table, meta.seq_lens, S)
    k = min(topk, scores.shape[-1])
    idx = scores.topk(k, dim=-1).indices  # the visible positions first (the others score -inf)
    return _slots(meta.block_table, idx, S), meta.seq_lens.clamp(max=k).to(torch.int32)


def _slots(table: torch.Tensor, idx: torch.Tensor, S: int) -> torch.Tensor:
    """Cache slots of positions ``idx`` [rows, K] through page-table rows ``table`` [rows or 1, P]."""
    pages = table.long().expand(idx.shape[0], -1).gather(1, torch.div(idx, S, rounding_mode="floor"))
    return pages * S + torch.remainder(idx, S)


def prefill_selection_triton(
    cache: torch.Tensor, meta: PrefillMeta, width: int, iq: torch.Tensor, iw: torch.Tensor, topk: int, heads: int
) -> list[PrefillBlock]:
    """``prefill_selection`` with the scores in Triton: per sequence, blocks of its new tokens (``ELEMENTS`` bounds
    a block's scores, kept positions and its ``heads``' attention sums over the latent ``width``), each query's
    top-k of the positions it sees, visible ones first."""
    blocks = []
    S = meta.page_size
    for s, (q0, n, ctx) in enumerate(zip(meta.q_start.tolist(), meta.q_len.tolist(), meta.ctx_len.tolist())):
        if n == 0:
            continue
        if ctx <= topk:  # every query keeps all it sees: dense causal MLA (the layer's expanded prefill)
            blocks.append(PrefillBlock(s, q0, q0 + n))
            continue
        table = meta.block_table[s : s + 1, : -(-ctx // S)]  # [1, pages]: every row reads the same table
        k = topk
        step = max(1, ELEMENTS // (table.shape[1] * S + 2 * k + heads * width))
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            sees = torch.arange(ctx - n + r0 + 1, ctx - n + r1 + 1, device=iq.device)  # [rows] positions seen
            rows = table.expand(r1 - r0, -1)
            scores = index_scores_paged(iq[q0 + r0 : q0 + r1], iw[q0 + r0 : q0 + r1], cache[:, 0, width:], rows,
                                        sees, S)  # fmt: skip
            idx = scores.topk(k, dim=-1).indices  # [rows, K]
            kept = torch.arange(k, device=iq.device)[None, :] < sees[:, None]  # the visible ones come first
            blocks.append(PrefillBlock(s, q0 + r0, q0 + r1, _slots(table, idx, S), kept))
    return blocks


def dsa_prefill_triton(
    q: torch.Tensor,  # [T, H, L] the absorbed queries
    cache: torch.Tensor,  # [slots, 1, L + Di]
    selection: list[PrefillBlock],
    scale: float,
    rank: int,
) -> torch.Tensor:  # [T, H, R], q's dtype
    """``dsa_prefill_reference``: the sparse blocks' rows, each a decode row over its kept latents (the dense blocks'
    rows stay zero: the layer runs them as MLA's prefill)."""
    out = q.new_zeros((q.shape[0], q.shape[1], rank))
    for b in selection:
        if b.slots is None or b.kept is None:
            continue
        counts = b.kept.sum(dim=1, dtype=torch.int32)
        meta = DecodeMeta(b.slots, counts, 1)
        out[b.start : b.stop] = mla_decode_triton(q[b.start : b.stop], cache[..., : q.shape[-1]], meta, scale, rank)
    return out


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
