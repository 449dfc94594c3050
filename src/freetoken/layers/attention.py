"""Attention over the paged KV pool (GQA, optional q/k norm, sliding window).

Decode steps (one new token per sequence) and the others (prefill, mixed) read the pages in place through
``paged_attention`` (Triton on CUDA, the torch reference elsewhere; never T x T). On CUDA a decode step's q/k
norms, rotary, K/V write and attention are one launch after the QKV GEMM (``paged_decode_rope_triton``).
T = new tokens in the step (all sequences, flattened), H / Hkv = query / KV heads, hd = head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from freetoken.cache.kv_pool import KVPool
from freetoken.experts.triton_support import triton_available
from freetoken.layers import cpu_step
from freetoken.layers.norm import rms_norm
from freetoken.layers.paged_attention import DecodeMeta, PrefillMeta, decode_attention, prefill_attention
from freetoken.layers.rope import Rotary


@dataclass
class SeqAttn:
    """One sequence of a prefill or mixed step, as the linear-attention layers read it (per sequence, on the host)."""

    q_start: int  # first row of this sequence's new tokens in the flattened step
    q_len: int
    start: int = 0  # the position of its first new token
    state_slot: int = 0  # its recurrent-state slot (models with linear-attention layers)
    captures: list[tuple[int, int]] = field(default_factory=list)  # (new tokens, checkpoint slot): states to save


@dataclass
class AttnBatch:
    """Per-step metadata shared by all layers."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64 flat KV slot where each new token's K/V goes
    decode: DecodeMeta | None = None  # set when every sequence computes one token
    prefill: PrefillMeta | None = None  # set on the other steps (prefill chunks, mixed steps)
    seqs: list[SeqAttn] = field(default_factory=list)  # the other steps' sequences (linear-attention layers)
    state_slots: torch.Tensor | None = None  # [B] int64 each sequence's recurrent-state slot (linear-attention layers)
    cpu_checked: bool = False  # the CPU step ops checked this step's metadata in its first layer (``cpu_step``)


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
        # One projection for q, k and v (one GEMM instead of three); w.q/k/v become views of its rows.
        self.qkv_w = torch.cat((w.q, w.k, w.v))
        nq, nk = w.q.shape[0], w.k.shape[0]
        w.q, w.k, w.v = self.qkv_w[:nq], self.qkv_w[nq : nq + nk], self.qkv_w[nq + nk :]
        biases = (w.q_bias, w.k_bias, w.v_bias)
        self.qkv_b = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else torch.zeros(n, dtype=w.q.dtype, device=w.q.device)
             for b, n in zip(biases, (nq, nk, nk), strict=True)]
        )  # fmt: skip
        # float32 CPU decode steps on a bf16 checkpoint read bf16 copies of the projections (cpu_step.linear)
        self.qkv_w16, self.o_w16 = cpu_step.bf16_copy(self.qkv_w), cpu_step.bf16_copy(w.o)
        # The fused q/k-norm + rotary + KV-write kernel takes per-head norms (or none) and no clipping.
        per_head = all(n is None or n.numel() == head_dim for n in (w.q_norm, w.k_norm))
        self._fused_rope = per_head and clip_qkv is None

    def _norm(self, x: torch.Tensor, weight: torch.Tensor | None, heads: int) -> torch.Tensor:
        """x [T, heads*hd] -> [T, heads, hd], normalised per head or over the whole projection."""
        if weight is not None and weight.numel() != self.hd:
            x = rms_norm(x, weight, self.eps)
        x = x.view(x.shape[0], heads, self.hd)
        if weight is not None and weight.numel() == self.hd:
            x = rms_norm(x, weight, self.eps)
        return x

    def _qkv_torch(
        self, qkv: torch.Tensor, batch: AttnBatch, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """q/k norms, rotary, the new K/V rows into the pool; returns q [T, H, hd] (the torch path)."""
        w, T = self.w, qkv.shape[0]
        nq, nk = self.h * self.hd, self.hkv * self.hd
        qh = self._norm(qkv[:, :nq], w.q_norm, self.h)
        kh = self._norm(qkv[:, nq : nq + nk], w.k_norm, self.hkv)
        vh = qkv[:, nq + nk :].reshape(T, self.hkv, self.hd)
        if self.clip is not None:  # OLMoE clamps after the q/k norms
            qh, kh, vh = (t.clamp(-self.clip, self.clip) for t in (qh, kh, vh))
        qh = self.rotary.apply(qh, batch.positions)
        kh = self.rotary.apply(kh, batch.positions)
        k_cache.index_copy_(0, batch.slot_mapping, kh.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.slot_mapping, vh.to(v_cache.dtype))
        return qh

    def forward(self, x: torch.Tensor, batch: AttnBatch, kv: KVPool) -> torch.Tensor:
        w = self.w
        qkv = cpu_step.linear(x, self.qkv_w, self.qkv_w16, self.qkv_b)
        k_cache, v_cache = kv.k[self.layer], kv.v[self.layer]
        if self._fused_rope and x.is_cuda and triton_available() and batch.decode is not None:
            from freetoken.layers.paged_attention.triton_decode import paged_decode_rope_triton

            r = self.rotary
            out = paged_decode_rope_triton(
                qkv, batch.positions, batch.slot_mapping, r.cos, r.sin, w.q_norm, w.k_norm, self.eps,
                k_cache, v_cache, batch.decode, self.h, self.hd, self.scale, self.window,
            )  # fmt: skip
            return self._out(x, out)
        if self._fused_rope and x.is_cuda and triton_available():
            from freetoken.layers.qkv_rope_triton import qkv_rope_triton

            r = self.rotary
            qh = qkv_rope_triton(
                qkv, batch.positions, batch.slot_mapping, r.cos, r.sin, w.q_norm, w.k_norm,
                k_cache, v_cache, self.h, self.hkv, self.hd, self.eps,
            )  # fmt: skip
        elif batch.decode is not None and self._fused_rope and cpu_step.available(qkv) and k_cache.dtype == qkv.dtype:
            return self._out(x, self._decode_cpu(qkv, batch, batch.decode, k_cache, v_cache))
        else:
            qh = self._qkv_torch(qkv, batch, k_cache, v_cache)
        if batch.decode is not None:
            out = decode_attention(qh.to(k_cache.dtype), k_cache, v_cache, batch.decode, self.scale, self.window)
            return self._out(x, out.to(x.dtype))
        assert batch.prefill is not None, "a step is a decode step or has prefill metadata"
        out = prefill_attention(qh.to(k_cache.dtype), k_cache, v_cache, batch.prefill, self.scale, self.window)
        return self._out(x, out.to(x.dtype))

    def _decode_cpu(
        self, qkv: torch.Tensor, batch: AttnBatch, d: DecodeMeta, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """A float32 CPU decode step's q/k norms, rotary, KV write and attention in one C++ call -> [B, H, hd]."""
        w, r = self.w, self.rotary
        out = cpu_step.decode_attention(
            qkv, (self.h, self.hkv, self.hd), (w.q_norm, w.k_norm, self.eps), (r.cos, r.sin), batch.positions,
            batch.slot_mapping, (k_cache, v_cache), d.block_table, d.seq_lens, d.page_size, self.scale, self.window,
            batch.cpu_checked,
        )  # fmt: skip
        batch.cpu_checked = True
        return out.view(qkv.shape[0], self.h, self.hd)

    def _out(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [T, H, hd] -> [T, D]: the output gate if any, then o_proj."""
        w = self.w
        flat = out.reshape(x.shape[0], self.h * self.hd)
        if w.gate is not None:
            flat = flat * torch.sigmoid(F.linear(x, w.gate))
        return cpu_step.linear(flat, w.o, self.o_w16, w.o_bias)
