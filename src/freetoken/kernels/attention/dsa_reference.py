"""The torch reference of DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5) over paged latents. Each cache row
holds the MLA latent ``[c (R), kr (dr)]`` (``mla_reference.py``) followed by the lightning indexer's key ``ik`` [Di].

- The indexer scores every context position t for a query: ``sum_h w[h] * relu(iq[h] . ik[t])`` (the head weights
  ``w`` carry the ``Hi^-0.5 * Di^-0.5`` scales: ``layers/dsa.py``), in float32 (``index_scores``).
- Each query keeps the ``min(topk, visible)`` best of the positions it may see (causal: its own and earlier ones):
  with a context no longer than ``index_topk`` it attends everything, as dense MLA does. A selection is made once
  per indexer layer (``decode_selection``, ``prefill_selection``) and may serve later layers (GLM-5's shared ones).
- Attention over the kept latents is absorbed, as MLA's decode: the query [H, R + dr] over the latents, values
  their first R columns (``dsa_decode_reference``; ``dsa_prefill_reference``: each new token gathers its kept
  latents - at most topk whatever the context - a block of tokens at a time, memory bounded; a sequence whose
  context is no longer than topk is dense causal MLA, which the layer runs as MLA's prefill).
Shapes: B sequences, T new tokens, H heads, Hi indexer heads, Di indexer head dim, L = R + dr (latent width).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.kernels.attention.decode_reference import context_slots

ELEMENTS = 1 << 26  # float32 values a prefill block of queries may hold (scores over the context, kept latents)


def index_scores(iq: torch.Tensor, iw: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """iq [..., n, Hi, Di], iw [..., n, Hi], keys [..., m, Di] -> the indexer's scores [..., n, m] float32."""
    dots = torch.matmul(iq.float(), keys.float().transpose(-1, -2).unsqueeze(-3))  # [..., n, Hi, m]
    return torch.matmul(iw.float().unsqueeze(-2), F.relu(dots)).squeeze(-2)


def _decode_context(meta: DecodeMeta) -> tuple[torch.Tensor, torch.Tensor]:
    if meta.block_table.is_cuda:  # a graph's metadata is rewritten in place: nothing may be kept from it
        return context_slots(meta, None)
    return meta.gathered.get(None) or meta.gathered.setdefault(None, context_slots(meta, None))


def decode_selection(
    cache: torch.Tensor, meta: DecodeMeta, width: int, iq: torch.Tensor, iw: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's kept positions as cache slots [B, K] int64, best first (K = min(topk, addressable
    positions); entries past a sequence's count are not slots), and the counts [B] int32 (min(topk, length)): a
    page table of page size 1 over the kept latents (``dsa_triton.py``). No host sync."""
    slots, valid = _decode_context(meta)
    scores = index_scores(iq[:, None], iw[:, None], cache[slots, 0, width:])[:, 0]  # [B, n]
    k = min(topk, scores.shape[-1])
    idx = scores.masked_fill(~valid, float("-inf")).topk(k, dim=-1).indices  # visible positions first
    return slots.gather(1, idx), meta.seq_lens.clamp(max=k).to(torch.int32)


def dsa_decode_reference(
    q: torch.Tensor,  # [B, H, L] the absorbed query
    cache: torch.Tensor,  # [slots, 1, L + Di]
    selection: tuple[torch.Tensor, torch.Tensor],  # ``decode_selection``'s
    scale: float,
    rank: int,  # R
) -> torch.Tensor:  # [B, H, R], q's dtype
    sel, counts = selection
    L = q.shape[-1]
    kept = torch.arange(sel.shape[1], device=sel.device)[None, :] < counts[:, None]  # [B, K]
    kv = cache[torch.where(kept, sel, 0), 0, :L].float()[:, None]  # [B, 1, K, L]
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None, :], kv, kv[..., :rank], attn_mask=kept[:, None, None, :], scale=scale, enable_gqa=True
    )  # [B, H, 1, R]
    return out[:, :, 0, :].to(q.dtype)


@dataclass
class PrefillBlock:
    """A block of sequence ``seq``'s new tokens: rows ``start:stop`` of the step, each query's kept positions as
    cache slots [rows, K] (best first) and whether each is one it sees [rows, K]. ``slots`` None: the sequence's
    context is no longer than topk, so every query keeps all it sees - dense causal MLA (``dense_meta``)."""

    seq: int
    start: int
    stop: int
    slots: torch.Tensor | None = None
    kept: torch.Tensor | None = None


def dense_meta(meta: PrefillMeta, blocks: list[PrefillBlock]) -> PrefillMeta | None:
    """The step's metadata restricted to the dense blocks' sequences (None: there are none)."""
    seqs = [b.seq for b in blocks if b.slots is None]
    if not seqs:
        return None
    idx = torch.tensor(seqs, device=meta.q_start.device)
    q_len = meta.q_len[idx]
    return PrefillMeta(meta.q_start[idx], q_len, meta.ctx_len[idx], meta.block_table[idx], meta.page_size,
                       max(b.stop - b.start for b in blocks if b.slots is None))  # fmt: skip


def prefill_selection(
    cache: torch.Tensor, meta: PrefillMeta, width: int, iq: torch.Tensor, iw: torch.Tensor, topk: int, heads: int
) -> list[PrefillBlock]:
    """Per sequence, a block of its new tokens at a time (``ELEMENTS`` bounds the block's scores over the context
    and its ``heads``' attention over the kept latents): each query's top-k of the positions it sees."""
    blocks = []
    S, table = meta.page_size, meta.block_table.long()
    for s, (q0, n, ctx) in enumerate(zip(meta.q_start.tolist(), meta.q_len.tolist(), meta.ctx_len.tolist())):
        if n == 0:
            continue
        if ctx <= topk:
            blocks.append(PrefillBlock(s, q0, q0 + n))
            continue
        pos = torch.arange(ctx, device=iq.device)
        slots = table[s, pos // S] * S + pos % S
        keys = cache[slots, 0, width:]  # [ctx, Di]
        k = min(topk, ctx)
        step = max(1, ELEMENTS // (ctx * iq.shape[1] + k * (width + heads)))
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            visible = pos[None, :] <= pos[ctx - n + r0 : ctx - n + r1, None]  # [rows, ctx] causal
            scores = index_scores(iq[q0 + r0 : q0 + r1], iw[q0 + r0 : q0 + r1], keys)
            idx = scores.masked_fill(~visible, float("-inf")).topk(k, dim=-1).indices  # [rows, K]
            blocks.append(PrefillBlock(s, q0 + r0, q0 + r1, slots[idx], visible.gather(1, idx)))
    return blocks


def dsa_prefill_reference(
    q: torch.Tensor,  # [T, H, L] the absorbed queries
    cache: torch.Tensor,  # [slots, 1, L + Di]
    selection: list[PrefillBlock],  # ``prefill_selection``'s
    scale: float,
    rank: int,  # R
) -> torch.Tensor:  # [T, H, R], q's dtype
    """The sparse blocks' rows (the dense ones' stay zero: the layer runs them as MLA's prefill)."""
    L = q.shape[-1]
    out = q.new_zeros((q.shape[0], q.shape[1], rank))
    for b in selection:
        if b.slots is None or b.kept is None:
            continue
        lat = cache[b.slots, 0, :L].float()  # [rows, K, L]
        sc = torch.einsum("nhl,nkl->nhk", q[b.start : b.stop].float(), lat) * scale
        p = torch.softmax(sc.masked_fill(~b.kept[:, None, :], float("-inf")), dim=-1)
        out[b.start : b.stop] = torch.einsum("nhk,nkr->nhr", p, lat[..., :rank]).to(q.dtype)
    return out
