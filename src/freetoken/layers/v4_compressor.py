"""DeepSeek-V4's KV compressors (torch reference) and where a layer's caches sit.

A V4 layer computes one row per token (``RowLayout.width`` channels): the token's window key (K = V, normed and
rotated), and on a compressed layer the compressor's raw projections of that token (``kv``, ``gate``: what transformers
buffers until a window closes). The rows live in rings of the request's state slot (``cache/state_pool.py``
``rows``, ``memory/sizes.py`` ``v4_state_rings``): the window keys of its last W positions, and the raw rows (the row
past its window key) of the last m positions (CSA: 2 m, its entries pool the window before too), the most a window
not yet closed reads. A compressed layer's entries sit in the KV pool's entry rows (``KVPool.e``: one row per m
tokens, ``RowLayout.entry_width`` channels): entry w in the row of its window's last token (w + 1) m - 1, so the
radix tree shares them with their pages; a request resumed after an edit takes its rings from a state checkpoint.

Heavily compressed attention (HCA, ``heavily_compressed_attention``, rate m'): entry w of tokens [w m', (w+1) m') =
``norm(sum_j softmax_j(gate_j + ape_j) * kv_j)``, rotated (``compress`` rope) at position w m'. Compressed sparse
attention (CSA, rate m): projections are 2 d wide (Ca | Cb); entry w mixes window w - 1's Ca with window w's Cb over
2 m slots (window 0: Cb alone); its lightning indexer compresses the same way at ``index_head_dim`` into keys the
queries score. Entry w is visible to a query at p once its window is complete: w < (p + 1) // m.
d = head_dim, di = index_head_dim, m = rate, nW = windows closing in a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.checkpoint.dsv4_config import CSA, HCA, SLIDING
from freetoken.kernels.linear import linear
from freetoken.layers.hyper_connections import v4_rms_norm
from freetoken.layers.v4_rope import InterleavedRope

HEADS_AT_ONCE = 8  # indexer heads scored together


@dataclass(frozen=True)
class RowLayout:
    """Where each part sits in a layer's per-token row (``part``) and in its entry row (``entry_part``: the compressed
    entry, CSA's indexer key), the same layout for every layer of one kind."""

    kind: str
    hd: int  # head_dim d
    ihd: int  # index_head_dim di (CSA)

    @property
    def series(self) -> int:
        """Compressed series per projection: 2 (Ca | Cb) on CSA, 1 on HCA."""
        return 2 if self.kind == CSA else 1

    def part(self, name: str) -> slice:
        d, di, s = self.hd, self.ihd, self.series
        sizes = [("window", d)]
        if self.kind != SLIDING:
            sizes += [("kv", s * d), ("gate", s * d)]
        if self.kind == CSA:
            sizes += [("ikv", 2 * di), ("igate", 2 * di)]
        return _find(sizes, name, f"a {self.kind} row")

    def raw_part(self, name: str) -> slice:
        """A part's place in the row past the window key (the raw ring's row: ``layers/v4_attention.py``)."""
        p = self.part(name)
        return slice(p.start - self.hd, p.stop - self.hd)

    def entry_part(self, name: str) -> slice:
        sizes = [("entry", self.hd)] if self.kind != SLIDING else []
        return _find(sizes + ([("ikey", self.ihd)] if self.kind == CSA else []), name, f"a {self.kind} entry")

    @property
    def width(self) -> int:
        d, di = self.hd, self.ihd
        return {SLIDING: d, HCA: 3 * d, CSA: 5 * d + 4 * di}[self.kind]

    @property
    def entry_width(self) -> int:
        return {SLIDING: 0, HCA: self.hd, CSA: self.hd + self.ihd}[self.kind]


def _find(sizes: list[tuple[str, int]], name: str, what: str) -> slice:
    at = 0
    for n, size in sizes:
        if n == name:
            return slice(at, at + size)
        at += size
    raise KeyError(f"{what} has no {name!r} part")


@dataclass
class Compressor:
    wkv: torch.Tensor  # [s*c, D]
    wgate: torch.Tensor  # [s*c, D]
    ape: torch.Tensor  # [m, s*c] float32: the gate's bias by position in the window
    norm: torch.Tensor  # [c] float32
    rate: int  # m
    dim: int  # c (d or di)
    overlap: bool  # CSA's two series
    eps: float

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> raw (kv, gate) [T, s*c] each."""
        return linear(x, self.wkv), linear(x, self.wgate)

    def entries(
        self, kv: torch.Tensor, gate: torch.Tensor, windows: torch.Tensor, rope: InterleavedRope
    ) -> torch.Tensor:
        """kv / gate [nW, (1 or 2) m, s*c] the raw rows of windows ``windows`` [nW] (CSA: the previous window's m rows
        first, then the window's; window 0's previous rows are ignored) -> entries [nW, c], rotated at w*m."""
        m, c = self.rate, self.dim
        gate = gate.float() + self.ape.repeat(gate.shape[1] // m, 1)[None]
        if self.overlap:
            kv = torch.cat((kv[:, :m, :c], kv[:, m:, c:]), dim=1)  # [nW, 2m, c]: Ca of w - 1, Cb of w
            gate = torch.cat((gate[:, :m, :c], gate[:, m:, c:]), dim=1)
            gate[:, :m] = gate[:, :m].masked_fill((windows == 0)[:, None, None], float("-inf"))
        w = torch.softmax(gate, dim=1).to(kv.dtype)
        pooled = v4_rms_norm((kv * w).sum(dim=1), self.norm, self.eps)
        return rope.apply(pooled, windows * m)


@dataclass
class Indexer:
    """CSA's lightning indexer: its own compressor (keys [di]), query heads from the q LoRA's residual, head weights."""

    comp: Compressor
    wq_b: torch.Tensor  # [Hi * di, q_lora_rank]
    weights_proj: torch.Tensor  # [Hi, D]
    heads: int
    topk: int

    def queries(self, q_resid: torch.Tensor, x: torch.Tensor, pos: torch.Tensor, rope: InterleavedRope
                ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """-> (q [T, Hi, di] rotated at ``pos``, head weights [T, Hi] float32, both scales folded in)."""
        di = self.comp.dim
        q = rope.apply(linear(q_resid, self.wq_b).view(-1, self.heads, di), pos)
        w = F.linear(x.float(), self.weights_proj.float()) * (self.heads**-0.5 * di**-0.5)
        return q, w

    @staticmethod
    def scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """q [n, Hi, di], w [n, Hi], keys [N, di] -> [n, N] (``head_scores`` over one key set)."""
        return head_scores(q, w, keys, "nhd,kd->nhk")


def head_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, spec: str) -> torch.Tensor:
    """The indexer's scores sum_h w_h relu(q_h . k), float32, HEADS_AT_ONCE heads at a time (never every head's scores
    at once). q [n, Hi, di], w [n, Hi]; ``spec`` is one head block's einsum: ``nhd,kd->nhk`` (keys [N, di], one set
    for every query) or ``bhd,bkd->bhk`` (keys [n, N, di], a set per query) -> [n, N]."""
    k, out = keys.float(), None
    for h0 in range(0, q.shape[1], HEADS_AT_ONCE):
        s = torch.relu(torch.einsum(spec, q[:, h0 : h0 + HEADS_AT_ONCE].float(), k))
        part = (s * w[:, h0 : h0 + HEADS_AT_ONCE, None]).sum(dim=1)
        out = part if out is None else out + part
    assert out is not None
    return out
