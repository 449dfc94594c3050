"""Attention over the paged KV pool (GQA, optional q/k norm, sliding window).

Decode steps (one new token per sequence) and the others (prefill, mixed) read the pages in place through
``paged_attention`` (Triton on CUDA, the torch reference elsewhere; never T x T). T = new tokens in the step
(all sequences, flattened), H / Hkv = query / KV heads, hd = head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.cache.kv_pool import KVPool
from freetoken.layers.norm import rms_norm
from freetoken.layers.paged_attention import DecodeMeta, PrefillMeta, decode_attention, prefill_attention
from freetoken.layers.rope import Rotary


@dataclass
class AttnBatch:
    """Per-step metadata shared by all layers."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64 flat KV slot where each new token's K/V goes
    decode: DecodeMeta | None = None  # set when every sequence computes one token
    prefill: PrefillMeta | None = None  # set on the other steps (prefill chunks, mixed steps)


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
            return F.linear(out.to(x.dtype).reshape(x.shape[0], self.h * self.hd), w.o, w.o_bias)
        assert batch.prefill is not None, "a step is a decode step or has prefill metadata"
        out = prefill_attention(qh.to(k_cache.dtype), k_cache, v_cache, batch.prefill, self.scale, self.window)
        return F.linear(out.to(x.dtype).reshape(x.shape[0], self.h * self.hd), w.o, w.o_bias)
