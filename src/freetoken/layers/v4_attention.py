"""DeepSeek-V4 attention over its state rings and KV entry rows (torch reference; ``v4_compressor.py``: the layout).

One KV head of ``head_dim`` shared by all query heads and read as both key and value (K = V), a ``window``-token sliding
window on every layer, and on compressed layers the compressed entries (HCA: every visible one; CSA: the ``index_topk``
its lightning indexer scores highest), all in one softmax with a learned sink logit per head. Queries come from a q LoRA
(``wq_a``, weighted RMSNorm, ``wq_b``, then an unweighted RMSNorm per head); keys from ``wkv`` and a weighted RMSNorm.
Both rotate their trailing ``rot`` channels (interleaved; ``main`` rope on sliding layers, ``compress`` on the others);
the output's rope slice is rotated back by the query's position, then the grouped low-rank output projection (``wo_a``
per group of heads, ``wo_b``). Per sequence, queries in blocks of ``BLOCK_ROWS``; the window keys and raw rows before
the step come from the sequence's state-slot rings (``Context``: the ring's, then the step's new rows; the newest go
back to the ring and to the checkpoints the step takes), the entries through its page table (a host-side loop: not
a CUDA-graph path). A decode step (one token per sequence) runs ``v4_decode.py``'s fixed-shape batch instead.
T = new tokens, H = heads, d = head dim, G = output groups, R = o_lora_rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.cache.state_pool import StatePool
from freetoken.kernels.linear import linear
from freetoken.kernels.triton_support import use_triton
from freetoken.layers.attention import AttnBatch
from freetoken.layers.hyper_connections import unweighted_rms, v4_rms_norm
from freetoken.layers.v4_compressor import CSA, SLIDING, Compressor, Indexer, RowLayout
from freetoken.layers.v4_decode import decode_attention
from freetoken.layers.v4_rope import InterleavedRope

BLOCK_ROWS = 256  # query rows per block of a prefill
Slots = Callable[[torch.Tensor], torch.Tensor]  # a sequence's positions -> their rows in the KV pool's entry layer


@dataclass
class V4AttentionWeights:
    wq_a: torch.Tensor  # [q_lora_rank, D]
    q_norm: torch.Tensor  # [q_lora_rank]
    wq_b: torch.Tensor  # [H * d, q_lora_rank]
    wkv: torch.Tensor  # [d, D]
    kv_norm: torch.Tensor  # [d]
    wo_a: torch.Tensor  # [G * R, H * d / G]
    wo_b: torch.Tensor  # [D, G * R]
    sinks: torch.Tensor  # [H] float32


@dataclass
class SeqView:
    """One sequence of a step: its rows of new tokens, its first new position, its page table row."""

    q_start: int
    q_len: int
    start: int
    table: torch.Tensor  # [P] page ids


def step_sequences(batch: AttnBatch) -> list[SeqView]:
    """The step's sequences from its prefill metadata (host reads: a reference path)."""
    p = batch.prefill
    assert p is not None, "a step that is not a decode step has prefill metadata"
    qs, ql, cl = p.q_start.tolist(), p.q_len.tolist(), p.ctx_len.tolist()
    return [SeqView(qs[i], ql[i], cl[i] - ql[i], p.block_table[i]) for i in range(len(qs))]


class V4Attention:
    def __init__(
        self, w: V4AttentionWeights, layer: int, layout: RowLayout, heads: int, groups: int, window: int,
        eps: float, rope: InterleavedRope, comp: Compressor | None = None, indexer: Indexer | None = None,
    ) -> None:  # fmt: skip
        if (comp is None) != (layout.kind == SLIDING) or (indexer is not None) != (layout.kind == CSA):
            raise ValueError(f"a {layout.kind} layer's compressor/indexer do not match its kind")
        self.w, self.layer, self.layout, self.h, self.groups = w, layer, layout, heads, groups
        self.window, self.eps, self.rope, self.comp, self.indexer = window, eps, rope, comp, indexer
        self.hd = layout.hd
        self.scans_table = comp is not None  # a decode step reads every entry its page table reaches (``v4_decode``)
        self.scale = self.hd**-0.5

    def forward(self, x: torch.Tensor, batch: AttnBatch, kv: KVPool, states: StatePool | None) -> torch.Tensor:
        assert states is not None, "a DeepSeek-V4 layer keeps its window and raw rows in the state pool's rings"
        T, H, d, lay = x.shape[0], self.h, self.hd, self.layout
        pos = batch.positions
        wring, rring = states.rows[2 * self.layer], states.rows[2 * self.layer + 1]  # [slots, W, d], [slots, span, r]
        q_resid = v4_rms_norm(linear(x, self.w.wq_a), self.w.q_norm, self.eps)
        q = self.rope.apply(unweighted_rms(linear(q_resid, self.w.wq_b).view(T, H, d), self.eps), pos)
        k = self.rope.apply(v4_rms_norm(linear(x, self.w.wkv), self.w.kv_norm, self.eps), pos)
        row = x.new_zeros((T, lay.width))
        row[:, lay.part("window")] = k
        if self.comp is not None:
            ckv, cgate = self.comp.project(x)
            row[:, lay.part("kv")], row[:, lay.part("gate")] = ckv, cgate
        if self.indexer is not None:
            ikv, igate = self.indexer.comp.project(x)
            row[:, lay.part("ikv")], row[:, lay.part("igate")] = ikv, igate
        row = row.to(wring.dtype)
        S = kv.page_size
        ents, R = (kv.e[self.layer], kv.entry_rows[self.layer]) if self.comp is not None else (row[:0], 0)
        self._check(kv, wring, rring)
        if batch.decode is not None:  # one token per sequence: fixed shapes, capturable (``v4_decode.py``)
            out = decode_attention(self, q, q_resid, x, row, batch, ents, (wring, rring), S, R)
        else:
            out = self._per_sequence(q, q_resid, x, row, batch, ents, (wring, rring), S, R)
        o = self.rope.apply(out.to(x.dtype), pos, inverse=True)  # [T, H, d]
        G = self.groups
        wa = self.w.wo_a.view(G, -1, H * d // G)  # [G, R, H*d/G]
        y = torch.einsum("tgi,gri->tgr", o.reshape(T, G, -1), wa.to(o.dtype)).reshape(T, -1)
        return linear(y, self.w.wo_b)

    def _per_sequence(
        self, q: torch.Tensor, q_resid: torch.Tensor, x: torch.Tensor, row: torch.Tensor, batch: AttnBatch,
        ents: torch.Tensor, rings: tuple[torch.Tensor, torch.Tensor], S: int, R: int,
    ) -> torch.Tensor:  # fmt: skip
        """A prefill or mixed step, sequence by sequence (host reads: a reference path) -> [T, H, d] f32."""
        (wring, rring), d = rings, self.hd
        m = self.comp.rate if self.comp is not None else 1
        out = torch.empty((x.shape[0], self.h, d), dtype=torch.float32, device=x.device)
        for s, slot, captures in self._sequences(batch):
            if s.q_len == 0:
                continue
            new = slice(s.q_start, s.q_start + s.q_len)
            wctx = _context(wring[slot], row[new, :d], s.start)  # [N, d], positions from wctx.base
            rctx = _context(rring[slot], row[new, d:], s.start)  # [N', width - d]

            def eslots(p: torch.Tensor, table: torch.Tensor = s.table) -> torch.Tensor:
                """Entry rows of positions ``p`` (windows' last tokens): R rows a page, one per m positions."""
                page = table[torch.div(p, S, rounding_mode="floor")].long()
                return page * R + torch.div(torch.remainder(p, S), m, rounding_mode="floor")

            self._close_windows(rctx, ents, s, eslots)
            for r0 in range(0, s.q_len, BLOCK_ROWS):
                r1 = min(s.q_len, r0 + BLOCK_ROWS)
                sub = slice(s.q_start + r0, s.q_start + r1)
                out[sub] = self._attend(wctx, ents, q[sub], q_resid[sub], x[sub], s.start + r0, s.start + r1, eslots,
                                        (s.table, S, R))  # fmt: skip
            for at, dst in [*captures, (s.q_len, slot)]:  # checkpoints after ``at`` new tokens, then the slot
                wctx.store(wring[dst], s.start + at)
                rctx.store(rring[dst], s.start + at)
        return out

    def _check(self, kv: KVPool, wring: torch.Tensor, rring: torch.Tensor) -> None:
        """The pool's entry rate and the state pool's ring lengths are this layer's (cheap: shapes)."""
        span = (2 if self.comp.overlap else 1) * self.comp.rate if self.comp is not None else 0
        want = (self.window, self.hd, span, self.layout.width - self.hd if span else 0)
        if (wring.shape[1], wring.shape[2], rring.shape[1], rring.shape[2]) != want:
            raise ValueError(f"layer {self.layer}: the state pool's rings {tuple(wring.shape[1:])}, "
                             f"{tuple(rring.shape[1:])} are not (window, d), (span, raw width) = {want}")  # fmt: skip
        if self.comp is not None and kv.entry_rates[self.layer] != self.comp.rate:
            raise ValueError(f"layer {self.layer}: the KV pool keeps an entry per {kv.entry_rates[self.layer]} tokens, "
                             f"its compressor's rate is {self.comp.rate}")  # fmt: skip

    @staticmethod
    def _sequences(batch: AttnBatch) -> list[tuple[SeqView, int, list[tuple[int, int]]]]:
        """The step's sequences with their state slots and checkpoint captures."""
        views = step_sequences(batch)
        return [(v, a.state_slot, a.captures) for v, a in zip(views, batch.seqs, strict=True)]

    def _close_windows(self, rctx: Context, ents: torch.Tensor, s: SeqView, eslots: Slots) -> None:
        """The compressed entries of the windows whose last token is new in this step, into those tokens' entry
        rows (the raw rows they pool: from ``rctx``, the raw ring's and the step's)."""
        if self.comp is None:
            return
        m, lay, dev = self.comp.rate, self.layout, ents.device
        end = s.start + s.q_len
        windows = torch.arange(s.start // m, end // m, device=dev)
        if windows.numel() == 0:
            return
        span = (2 if self.comp.overlap else 1) * m
        first = (windows + 1) * m - span  # [nW]: the first raw row each entry reads (CSA: window w - 1's)
        raw = rctx.at((first[:, None] + torch.arange(span, device=dev)[None]).clamp(min=0))  # [nW, span, width - d]
        dst = eslots((windows + 1) * m - 1)
        ent = self.comp.entries(raw[..., lay.raw_part("kv")], raw[..., lay.raw_part("gate")], windows, self.rope)
        ents[dst, lay.entry_part("entry")] = ent.to(ents.dtype)
        if self.indexer is not None:
            ic = self.indexer.comp
            key = ic.entries(raw[..., lay.raw_part("ikv")], raw[..., lay.raw_part("igate")], windows, self.rope)
            ents[dst, lay.entry_part("ikey")] = key.to(ents.dtype)

    def _attend(
        self, wctx: Context, ents: torch.Tensor, q: torch.Tensor, q_resid: torch.Tensor, x: torch.Tensor, p0: int,
        p1: int, eslots: Slots, paged: tuple[torch.Tensor, int, int],
    ) -> torch.Tensor:
        """Queries at positions [p0, p1) ([n, H, d]) over the window and the entries they may see -> [n, H, d] f32.
        A CSA layer whose context holds more entries than the indexer keeps gathers each query's kept entries
        ([n, topk, d]: the scores never span every entry times every head; on CUDA they come from Triton, each key
        read in place through ``paged``: the sequence's page table, page size, entry rows a page)."""
        dev, lay, W = q.device, self.layout, self.window
        qpos = torch.arange(p0, p1, device=dev)
        kpos = torch.arange(max(0, p0 - W + 1), p1, device=dev)
        keys = wctx.at(kpos).float()  # [Nk, d]
        mask = (kpos[None] <= qpos[:, None]) & (kpos[None] > qpos[:, None] - W)  # [n, Nk]
        s = torch.einsum("nhd,kd->nhk", q.float(), keys).masked_fill(~mask[:, None], float("-inf"))
        kept: torch.Tensor | None = None  # [n, k, d] each query's own entries (CSA past topk)
        if self.comp is not None:
            m = self.comp.rate
            n_ent = p1 // m
            rows = eslots(torch.arange(n_ent, device=dev) * m + m - 1)
            seen = torch.arange(n_ent, device=dev)[None] < torch.div(qpos + 1, m, rounding_mode="floor")[:, None]
            ent = ents[rows, lay.entry_part("entry")].float()  # [N, d]
            if self.indexer is not None and n_ent > self.indexer.topk:
                iq, iw = self.indexer.queries(q_resid, x, qpos, self.rope)
                if use_triton(ents):
                    from freetoken.kernels.attention.index_triton import index_scores_paged

                    table, S, R = paged
                    vis = torch.div(qpos + 1, m, rounding_mode="floor")
                    sc = index_scores_paged(iq, iw, ents[:, lay.entry_part("ikey")], table[None].expand(len(qpos), -1),
                                            vis, S, m, R)[:, :n_ent]  # fmt: skip
                else:
                    sc = self.indexer.scores(iq, iw, ents[rows, lay.entry_part("ikey")])
                sc = sc.masked_fill(~seen, float("-inf"))
                top = sc.topk(self.indexer.topk, dim=-1).indices  # [n, k]
                kept, seen = ent[top], seen.gather(1, top)
                se = torch.einsum("nhd,nkd->nhk", q.float(), kept)
            else:
                se = torch.einsum("nhd,kd->nhk", q.float(), ent)
                kept = ent
            s = torch.cat((s, se.masked_fill(~seen[:, None], float("-inf"))), dim=-1)
        s = s * self.scale
        sink = self.w.sinks.float().view(1, -1, 1).expand(s.shape[0], -1, 1)
        p = torch.softmax(torch.cat((s, sink), dim=-1), dim=-1)[..., :-1]
        Nk = keys.shape[0]
        out = torch.einsum("nhk,kd->nhd", p[..., :Nk], keys)
        if kept is not None:
            pe = p[..., Nk:]
            out = out + (torch.einsum("nhk,nkd->nhd", pe, kept) if kept.dim() == 3 else pe @ kept)
        return out


@dataclass
class Context:
    """A sequence's per-token rows of one ring for a step: the ring's positions [base, start) (the newest it holds,
    none below 0), then the step's new rows; ``at(p)`` reads positions p >= base."""

    rows: torch.Tensor  # [N, w]
    base: int

    def at(self, p: torch.Tensor) -> torch.Tensor:
        return self.rows[p - self.base]

    def store(self, ring: torch.Tensor, upto: int) -> None:
        """The newest ring-length positions before ``upto`` (none below 0 or ``base``) into ``ring`` [n, w] at p % n."""
        n = ring.shape[0]
        if n == 0:
            return
        p = torch.arange(max(self.base, upto - n), upto, device=ring.device)
        ring.index_copy_(0, torch.remainder(p, n), self.rows[p - self.base])


def _context(ring: torch.Tensor, new: torch.Tensor, start: int) -> Context:
    """``ring`` [n, w] (position p at row p % n) and ``new`` [q, w], the rows of positions start .. start + q - 1."""
    n = ring.shape[0]
    base = max(0, start - n)
    prev = ring[torch.remainder(torch.arange(base, start, device=ring.device), n)] if n else ring
    return Context(torch.cat((prev, new)), base)
