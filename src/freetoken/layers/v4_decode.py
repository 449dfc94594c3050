"""DeepSeek-V4 attention's decode step (one new token per sequence, batched) in torch ops of fixed shapes: no host
read of a device value and no shape that depends on one, so the whole decode step can be captured as one CUDA graph
(``runner/step_graph.py``). Prefill and mixed steps take ``v4_attention.py``'s per-sequence path; both write the same
rings and entry rows (``v4_compressor.py``: the layout), and the reference tests hold both to transformers.

Per sequence b at position p (``batch.positions``) with state slot s (``batch.state_slots``) and page table row t:
- its new row goes into its rings first: the window key at ``wring[s, p % W]`` (the position it replaces, p - W, has
  left the window), the raw row at ``rring[s, p % span]``;
- every sequence computes the entry of the window p belongs to (w = p // m, from the raw rows of positions
  p - span + 1 .. p, read at p % span; those below 0 read position 0's row, as the prefill path's clamp, and CSA's
  window 0 ignores them), and writes it to the entry row of p only where p closes that window ((p + 1) % m == 0;
  elsewhere the row gets its own value back);
- the query attends the W ring rows (row r holds position p - ((p - r) mod W); those below 0 masked) and every entry
  row its page table reaches (E = P S // m entries: entry e of position e m + m - 1), those not yet complete
  (e >= (p + 1) // m) masked; a CSA layer whose table reaches more entries than its indexer keeps scores them all and
  keeps its top ``index_topk`` (the masked ones score -inf; on CUDA the scores come from Triton, ``index_triton.py``).
  Masked keys are zeroed before they are read, so rows of pages past the sequence's (any values) never reach the
  output.
B = sequences, H = heads, d = head dim, W = window, E = entries the page table reaches, k = kept entries.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from freetoken.kernels.triton_support import use_triton
from freetoken.layers.attention import AttnBatch
from freetoken.layers.v4_compressor import Compressor, Indexer, RowLayout, head_scores
from freetoken.layers.v4_rope import InterleavedRope


class V4Attention(Protocol):
    """What this path reads of a layer (``v4_attention.V4Attention``, which imports this module)."""

    w: Any  # its V4AttentionWeights
    layout: RowLayout
    hd: int
    scale: float
    window: int
    rope: InterleavedRope
    comp: Compressor | None
    indexer: Indexer | None

NEG = float("-inf")


def decode_attention(
    a: V4Attention, q: torch.Tensor, q_resid: torch.Tensor, x: torch.Tensor, row: torch.Tensor, batch: AttnBatch,
    ents: torch.Tensor, rings: tuple[torch.Tensor, torch.Tensor], page_size: int, entry_rows: int,
) -> torch.Tensor:  # fmt: skip
    """q [B, H, d], q_resid [B, q_lora_rank], x [B, D], the step's rows [B, width] (ring dtype), ``ents`` the layer's
    entry rows, ``rings`` its (window [slots, W, d], raw [slots, span, width - d]) -> attention output [B, H, d] f32."""
    meta, slots = batch.decode, batch.state_slots
    assert meta is not None and slots is not None, "a DeepSeek-V4 decode step needs its page tables and state slots"
    wring, rring = rings
    p, d, W = batch.positions, a.hd, a.window
    table = meta.block_table.long()  # [B, P]
    wring[slots, torch.remainder(p, W)] = row[:, :d]
    r = torch.arange(W, device=p.device)
    kpos = p[:, None] - torch.remainder(p[:, None] - r[None], W)  # [B, W]: the position ring row r holds
    ok = kpos >= 0
    keys = torch.where(ok[..., None], wring[slots].float(), 0.0)  # [B, W, d]
    s = torch.einsum("bhd,bkd->bhk", q.float(), keys).masked_fill(~ok[:, None], NEG)
    kept: torch.Tensor | None = None  # [B, k, d]
    if a.comp is not None:
        _close_window(a, row[:, d:], p, slots, table, ents, rring, page_size, entry_rows)
        kept, seen = _entries(a, q_resid, x, p, table, ents, page_size, entry_rows)
        if kept is not None:
            se = torch.einsum("bhd,bkd->bhk", q.float(), kept).masked_fill(~seen[:, None], NEG)
            s = torch.cat((s, se), dim=-1)
    s = s * a.scale
    sink = a.w.sinks.float().view(1, -1, 1).expand(s.shape[0], -1, 1)
    pr = torch.softmax(torch.cat((s, sink), dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("bhk,bkd->bhd", pr[..., :W], keys)
    if kept is not None:
        out = out + torch.einsum("bhk,bkd->bhd", pr[..., W:], kept)
    return out


def _entry_row(table: torch.Tensor, last: torch.Tensor, page_size: int, m: int, entry_rows: int) -> torch.Tensor:
    """The entry rows [B, n] of windows ending at positions ``last`` [B, n], through the page tables [B, P]."""
    page = table.gather(1, torch.div(last, page_size, rounding_mode="floor"))
    return page * entry_rows + torch.div(torch.remainder(last, page_size), m, rounding_mode="floor")


def _close_window(
    a: V4Attention, raw_new: torch.Tensor, p: torch.Tensor, slots: torch.Tensor, table: torch.Tensor,
    ents: torch.Tensor, rring: torch.Tensor, page_size: int, entry_rows: int,
) -> None:  # fmt: skip
    """The raw row into the raw ring; the entry of each window that p closes into p's entry row."""
    comp, lay = a.comp, a.layout
    assert comp is not None
    m, span = comp.rate, rring.shape[1]
    rring[slots, torch.remainder(p, span)] = raw_new
    src = (p[:, None] - span + 1 + torch.arange(span, device=p.device)[None]).clamp(min=0)  # [B, span]
    raw = rring[slots[:, None], torch.remainder(src, span)]  # [B, span, width - d]
    windows = torch.div(p, m, rounding_mode="floor")
    closes = (torch.remainder(p + 1, m) == 0)[:, None]  # [B, 1]
    dst = _entry_row(table, p[:, None], page_size, m, entry_rows)[:, 0]  # [B]
    parts = [("entry", comp, "kv", "gate")]
    if a.indexer is not None:
        parts.append(("ikey", a.indexer.comp, "ikv", "igate"))
    for part, c, kv, gate in parts:
        ent = c.entries(raw[..., lay.raw_part(kv)], raw[..., lay.raw_part(gate)], windows, a.rope).to(ents.dtype)
        cols = lay.entry_part(part)
        ents[dst, cols] = torch.where(closes, ent, ents[dst, cols])


def _entries(
    a: V4Attention, q_resid: torch.Tensor, x: torch.Tensor, p: torch.Tensor, table: torch.Tensor,
    ents: torch.Tensor, page_size: int, entry_rows: int,
) -> tuple[torch.Tensor | None, torch.Tensor]:  # fmt: skip
    """The compressed entries each query reads ([B, k, d] f32, zeros where masked; None when its page table reaches
    none) and which of them it may see ([B, k])."""
    comp, lay = a.comp, a.layout
    assert comp is not None
    m = comp.rate
    E = table.shape[1] * page_size // m
    e = torch.arange(E, device=p.device)[None]  # [1, E]
    seen = e < torch.div(p + 1, m, rounding_mode="floor")[:, None]  # [B, E]
    if E == 0:
        return None, seen
    rows = _entry_row(table, (e * m + m - 1).expand(p.shape[0], -1), page_size, m, entry_rows)  # [B, E]
    if a.indexer is not None and E > a.indexer.topk:
        iq, iw = a.indexer.queries(q_resid, x, p, a.rope)
        ikey = lay.entry_part("ikey")
        if use_triton(ents):  # each key read in place, once for all heads (``kernels/attention/index_triton.py``)
            from freetoken.kernels.attention.index_triton import index_scores_paged

            visible = torch.div(p + 1, m, rounding_mode="floor")
            scores = index_scores_paged(iq, iw, ents[:, ikey], table, visible, page_size, m, entry_rows)
        else:
            ikeys = torch.where(seen[..., None], ents[rows, ikey].float(), 0.0)  # [B, E, di]
            scores = index_scores(iq, iw, ikeys).masked_fill(~seen, NEG)
        top = scores.topk(a.indexer.topk, dim=-1).indices  # [B, k]
        rows, seen = rows.gather(1, top), seen.gather(1, top)
    return torch.where(seen[..., None], ents[rows, lay.entry_part("entry")].float(), 0.0), seen


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [B, Hi, di], w [B, Hi], each query's own keys [B, E, di] -> [B, E] (``head_scores``, a key set per query)."""
    return head_scores(q, w, keys, "bhd,bkd->bhk")
