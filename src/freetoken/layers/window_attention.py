"""Sliding-window attention whose KV is a ring (gpt-oss's window layers): a request keeps K and V of its last W tokens
only, in its state slot (``cache/state_pool.py``: ``ring_k[r]``, ``ring_v[r]`` ``[S, W, Hkv, hd]``, position p at row
p % W), so the layer's memory is W tokens a request whatever the context, and a checkpoint of the ring (taken at the
anchors like the recurrent states, ``SeqAttn.captures``) resumes it after an edit.

A step's queries attend to the ring (the W positions before the sequence's first new token; those below 0 masked) and
to the step's own new K/V, causally within the window (a query at p sees p - W < t <= p), with the per-head sinks where
the model has them; then the ring takes the newest W positions. Decode steps run batched from ``batch.state_slots``
with no host read (fixed shapes: a CUDA graph captures them; on CUDA through the paged decode kernel, the ring read as
one page a sequence: ``ring_decode_triton``); other steps run per sequence, their queries in blocks
so a long prompt never builds more than [block, W + block] scores. T = new tokens (all sequences), H / Hkv = query /
KV heads, hd = head dim, W = window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.cache.state_pool import StatePool
from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.sinks import sdpa_with_sinks
from freetoken.kernels.linear import linear
from freetoken.kernels.triton_support import use_triton
from freetoken.layers.attention import AttentionWeights, AttnBatch, SeqAttn
from freetoken.layers.rope import Rotary

BLOCK_ROWS = 256  # query rows per block of a prefill


class WindowAttention:
    def __init__(
        self,
        w: AttentionWeights,
        ring: int,  # this layer's index among the state pool's rings
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: Rotary,
        window: int,
        sinks: torch.Tensor | None = None,  # [H] float32
    ) -> None:
        if w.q_norm is not None or w.k_norm is not None or w.gate is not None:
            raise ValueError("a ring window layer takes no q/k norms and no output gate")
        self.w, self.ring, self.window, self.sinks = w, ring, window, sinks
        self.h, self.hkv, self.hd, self.rotary = num_heads, num_kv_heads, head_dim, rotary
        self.scale = head_dim**-0.5
        self.qkv_w = torch.cat((w.q, w.k, w.v))
        biases = (w.q_bias, w.k_bias, w.v_bias)
        sizes = (w.q.shape[0], w.k.shape[0], w.v.shape[0])
        self.qkv_b = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else torch.zeros(n, dtype=w.q.dtype, device=w.q.device) for b, n in zip(biases, sizes)]
        )  # fmt: skip

    def forward(self, x: torch.Tensor, batch: AttnBatch, states: StatePool | None) -> torch.Tensor:
        assert states is not None, "a ring window layer needs the state pool"
        T, H, Hkv, hd = x.shape[0], self.h, self.hkv, self.hd
        q, k, v = linear(x, self.qkv_w, self.qkv_b).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = self.rotary.apply(q.reshape(T, H, hd), batch.positions)
        k = self.rotary.apply(k.reshape(T, Hkv, hd), batch.positions)
        v = v.reshape(T, Hkv, hd)
        rk, rv = states.ring_k[self.ring], states.ring_v[self.ring]
        if batch.decode is not None:
            out = self._decode(q, k.to(rk.dtype), v.to(rv.dtype), batch, rk, rv)
        else:
            out = self._prefill(q, k.to(rk.dtype), v.to(rv.dtype), batch.seqs, rk, rv)
        return linear(out.reshape(T, H * hd).to(x.dtype), self.w.o, self.w.o_bias)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, H, n, hd], k / v [B, Hkv, N, hd], mask [B, 1, n, N] -> [B, H, n, hd] float32."""
        if self.sinks is not None:
            return sdpa_with_sinks(q, k, v, mask, self.scale, self.sinks)
        return F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=mask, scale=self.scale, enable_gqa=self.h != self.hkv
        )

    def _decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: AttnBatch, rk: torch.Tensor, rv: torch.Tensor
    ) -> torch.Tensor:
        """One new token per sequence at position p: the ring's positions p - W .. p - 1 (p - W and those below 0
        masked) and the token itself; then the token's K/V into ring row p % W."""
        assert batch.state_slots is not None, "a decode step over ring window layers needs state slots"
        W, slots, pos = self.window, batch.state_slots, batch.positions
        if use_triton(q):
            return ring_decode_triton(q, k, v, slots, pos, rk, rv, self.scale, self.sinks)
        kpos = pos[:, None] - W + torch.arange(W, device=pos.device)[None, :]  # [B, W]
        rows = torch.remainder(kpos, W)
        keys = torch.cat((rk[slots[:, None], rows], k[:, None]), dim=1).transpose(1, 2)  # [B, Hkv, W+1, hd]
        vals = torch.cat((rv[slots[:, None], rows], v[:, None]), dim=1).transpose(1, 2)
        valid = torch.cat(((kpos > pos[:, None] - W) & (kpos >= 0), torch.ones_like(pos[:, None], dtype=torch.bool)), 1)
        out = self._attend(q[:, :, None, :], keys, vals, valid[:, None, None, :])  # [B, H, 1, hd]
        here = torch.remainder(pos, W)
        rk[slots, here] = k
        rv[slots, here] = v
        return out[:, :, 0, :]

    def _prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: list[SeqAttn], rk: torch.Tensor, rv: torch.Tensor
    ) -> torch.Tensor:
        """Per sequence: keys = the ring's W positions before its first new token, then its new tokens (index i of
        ``keys`` is position start - W + i); queries in blocks; the ring then holds the newest W, and each checkpoint
        slot the W before its offset."""
        W = self.window
        out = torch.empty((q.shape[0], self.h, self.hd), dtype=torch.float32, device=q.device)
        for s in seqs:
            n, start, dev = s.q_len, s.start, q.device
            if n == 0:
                continue
            rows = slice(s.q_start, s.q_start + n)
            kpos = torch.arange(start - W, start + n, device=dev)  # positions of the keys below
            ring_rows = torch.remainder(kpos[:W], W)
            keys = torch.cat((rk[s.state_slot, ring_rows], k[rows]))  # [W + n, Hkv, hd]
            vals = torch.cat((rv[s.state_slot, ring_rows], v[rows]))
            for r0 in range(0, n, BLOCK_ROWS):
                r1 = min(n, r0 + BLOCK_ROWS)
                qpos = torch.arange(start + r0, start + r1, device=dev)[:, None]
                lo, hi = r0 + 1, W + r1  # the keys rows r0 .. r1 - 1 can see: positions start + r0 - W + 1 ..
                kp = kpos[None, lo:hi]
                mask = (kp <= qpos) & (kp > qpos - W) & (kp >= 0)
                o = self._attend(q[rows][None, r0:r1].transpose(1, 2), keys[None, lo:hi].transpose(1, 2),
                                 vals[None, lo:hi].transpose(1, 2), mask[None, None])  # fmt: skip
                out[s.q_start + r0 : s.q_start + r1] = o[0].transpose(0, 1)
            for off, slot in s.captures:  # the ring after `off` new tokens: positions start + off - W .. + off - 1
                self._store(rk, rv, slot, kpos[off : off + W], keys[off : off + W], vals[off : off + W])
            self._store(rk, rv, s.state_slot, kpos[n : n + W], keys[n : n + W], vals[n : n + W])
        return out

    def _store(
        self, rk: torch.Tensor, rv: torch.Tensor, slot: int, pos: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor
    ) -> None:
        """W consecutive positions' K/V into slot ``slot``'s ring rows (distinct: pos % W)."""
        at = torch.remainder(pos, self.window)
        rk[slot].index_copy_(0, at, keys)
        rv[slot].index_copy_(0, at, vals)


def ring_decode_triton(
    q: torch.Tensor,  # [B, H, hd] one new token per sequence, roped
    k: torch.Tensor,  # [B, Hkv, hd] its K and V (ring dtype)
    v: torch.Tensor,
    slots: torch.Tensor,  # [B] state slots
    pos: torch.Tensor,  # [B] int64 the tokens' positions
    rk: torch.Tensor,  # [S, W, Hkv, hd] the layer's rings (contiguous)
    rv: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:  # [B, H, hd] float32
    """``WindowAttention._decode`` through the paged decode kernel: the token's K/V first replace ring row p % W, which
    held position p - W, the one position its window drops; then rows 0 .. min(p + 1, W) - 1 of the slot's ring are
    exactly its window (softmax does not care in which order), read as one page of W rows a sequence (the block table
    is the slots). Three launches and no host read, where the torch path takes about twenty small ops."""
    S, W, hkv, hd = rk.shape
    from freetoken.kernels.attention.triton_decode import BLOCK_N, default_splits, paged_decode_triton

    here = torch.remainder(pos, W)
    rk[slots, here] = k
    rv[slots, here] = v
    meta = DecodeMeta(block_table=slots[:, None], seq_lens=torch.clamp(pos + 1, max=W), page_size=W)
    splits = max(1, min(default_splits(q.shape[0], hkv), -(-W // BLOCK_N)))
    out = paged_decode_triton(q, rk.view(S * W, hkv, hd), rv.view(S * W, hkv, hd), meta, scale, splits=splits,
                              sinks=sinks)  # fmt: skip
    return out.float()
