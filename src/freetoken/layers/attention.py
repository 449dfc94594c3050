"""Attention over the paged KV pool (GQA, optional q/k norm, sliding window).

Decode steps (one new token per sequence) read the pages in place through ``paged_attention``
(Triton on CUDA, the torch reference elsewhere); other steps gather each sequence's pages and run SDPA
per sequence. T = new tokens in the step (all sequences, flattened), H / Hkv = query / KV heads,
hd = head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from freetoken.cache.kv_pool import KVPool
from freetoken.layers.norm import rms_norm
from freetoken.layers.paged_attention import DecodeMeta, decode_attention
from freetoken.layers.rope import Rotary


@dataclass
class SeqAttn:
    q_start: int  # first row of this sequence's new tokens in the flattened step
    q_len: int
    kv_slots: torch.Tensor  # [ctx_len] flat KV slots of positions 0..ctx_len-1 (device, int64)
    mask: torch.Tensor | None  # [q_len, ctx_len] bool (True = attend), None = all visible
    state_slot: int = 0  # its recurrent-state slot (models with linear-attention layers)
    captures: list[tuple[int, int]] = field(default_factory=list)  # (new tokens, checkpoint slot): states to save


@dataclass
class AttnBatch:
    """Per-step metadata shared by all layers."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64 flat KV slot where each new token's K/V goes
    seqs: list[SeqAttn]  # prefill and mixed steps
    decode: DecodeMeta | None = None  # set when every sequence computes one token (seqs is then empty)
    state_slots: torch.Tensor | None = None  # [B] int64 each sequence's recurrent-state slot (linear-attention layers)


def build_mask(q_len: int, ctx_len: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    if q_len == 1 and (window is None or ctx_len <= window):
        return None
    q_pos = torch.arange(ctx_len - q_len, ctx_len, device=device)[:, None]
    k_pos = torch.arange(ctx_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= (q_pos - k_pos) < window
    return mask


@dataclass
class AttentionWeights:
    q: torch.Tensor  # [H*hd, D]
    k: torch.Tensor  # [Hkv*hd, D]
    v: torch.Tensor  # [Hkv*hd, D]
    o: torch.Tensor  # [D, H*hd]
    o_bias: torch.Tensor | None = None
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # [hd] (per head) or [H*hd] (whole projection)
    k_norm: torch.Tensor | None = None
    gate: torch.Tensor | None = None  # [H*hd, D]: a sigmoid gate on the attention output (Qwen3-Next)


class Attention:
    def __init__(
        self,
        w: AttentionWeights,
        layer: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        rotary: Rotary,
        clip_qkv: float | None = None,
        window: int | None = None,
    ) -> None:
        self.w, self.layer, self.window = w, layer, window
        self.h, self.hkv, self.hd, self.eps = num_heads, num_kv_heads, head_dim, eps
        self.rotary, self.clip = rotary, clip_qkv
        self.scale = head_dim**-0.5

    def _norm(self, x: torch.Tensor, weight: torch.Tensor | None, heads: int) -> torch.Tensor:
        """x [T, heads*hd] -> [T, heads, hd], normalised per head or over the whole projection."""
        if weight is not None and weight.numel() != self.hd:
            x = rms_norm(x, weight, self.eps)
        x = x.view(x.shape[0], heads, self.hd)
        if weight is not None and weight.numel() == self.hd:
            x = rms_norm(x, weight, self.eps)
        return x

    def forward(self, x: torch.Tensor, batch: AttnBatch, kv: KVPool) -> torch.Tensor:
        w = self.w
        qh = self._norm(F.linear(x, w.q, w.q_bias), w.q_norm, self.h)
        kh = self._norm(F.linear(x, w.k, w.k_bias), w.k_norm, self.hkv)
        vh = F.linear(x, w.v, w.v_bias).view(x.shape[0], self.hkv, self.hd)
        if self.clip is not None:  # OLMoE clamps after the q/k norms
            qh, kh, vh = (t.clamp(-self.clip, self.clip) for t in (qh, kh, vh))
        qh = self.rotary.apply(qh, batch.positions)
        kh = self.rotary.apply(kh, batch.positions)
        k_cache, v_cache = kv.k[self.layer], kv.v[self.layer]
        k_cache.index_copy_(0, batch.slot_mapping, kh.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.slot_mapping, vh.to(v_cache.dtype))
        if batch.decode is not None:
            out = decode_attention(qh.to(k_cache.dtype), k_cache, v_cache, batch.decode, self.scale, self.window)
            return self._out(x, out.to(x.dtype))
        out = torch.empty_like(qh)
        for s in batch.seqs:
            qs = qh[s.q_start : s.q_start + s.q_len].transpose(0, 1)  # [H, q, hd]
            ks = k_cache[s.kv_slots].transpose(0, 1)  # [Hkv, ctx, hd]
            vs = v_cache[s.kv_slots].transpose(0, 1)
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=s.mask, scale=self.scale, enable_gqa=self.h != self.hkv
            )
            out[s.q_start : s.q_start + s.q_len] = o.transpose(0, 1)
        return self._out(x, out)

    def _out(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [T, H, hd] -> [T, D]: the output gate if any, then o_proj."""
        w = self.w
        flat = out.reshape(x.shape[0], self.h * self.hd)
        if w.gate is not None:
            flat = flat * torch.sigmoid(F.linear(x, w.gate))
        return F.linear(flat, w.o, w.o_bias)
