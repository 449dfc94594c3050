"""Attention over the paged KV pool (GQA, optional q/k norm, sliding window, attention sinks).

Decode steps (one new token per sequence) and the others (prefill, mixed) read the pages in place through an
attention backend (``kernels/attention``'s registry, chosen by device: Triton on CUDA, the torch reference elsewhere;
never T x T). Where the backend has them, a decode step's q/k norms, rotary, K/V write and attention are one call
after the QKV GEMM (one Triton launch on CUDA, one C++ call on a float32 CPU), and a prefill's q/k part is one.
T = new tokens in the step (all sequences, flattened), H / Hkv = query / KV heads, hd = head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from freetoken.cache.kv_pool import KVPool
from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.kernels.attention.backend import QKVRope
from freetoken.kernels.attention.registry import select
from freetoken.kernels.linear import linear
from freetoken.kernels.norm import rms_norm
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
    meta_checked: bool = False  # a fused decode call checked this step's metadata in an earlier layer
    # DeepSeek sparse attention: each indexer layer's top-k of this step, for the later layers sharing it (GLM-5)
    selections: dict[int, object] = field(default_factory=dict)
    input_ids: torch.Tensor | None = None  # [T] the step's tokens, for layers routed by token id (DeepSeek-V4)
    # Gemma-4: this step's per-layer input embeddings [T, L, P] (``models/gemma4_layers.py``)
    per_layer: torch.Tensor | None = None


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
        backend: str = "auto",
        sinks: torch.Tensor | None = None,
    ) -> None:
        """``window``: this layer's sliding window (None: full attention); ``sinks``: [H] float32 sink logits
        (gpt-oss: one per head, in every softmax's denominator)."""
        self.w, self.layer, self.window, self.sinks = w, layer, window, sinks
        self.backend = select(w.q.device, backend)
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
        qkv = linear(x, self.qkv_w, self.qkv_b)
        caches = k_cache, v_cache = kv.k[self.layer], kv.v[self.layer]
        qh = None
        if self._fused_rope:
            rope = self._rope(batch)
            if batch.decode is not None:
                fused = self.backend.decode_fused(
                    qkv, rope, caches, batch.decode, self.scale, self.window, batch.meta_checked, self.sinks
                )
                if fused is not None:
                    batch.meta_checked = True
                    return self._out(x, fused)
            qh = self.backend.qkv_rope(qkv, rope, caches)
        if qh is None:
            qh = self._qkv_torch(qkv, batch, k_cache, v_cache)
        if batch.decode is not None:
            out = self.backend.decode(
                qh.to(k_cache.dtype), k_cache, v_cache, batch.decode, self.scale, self.window, self.sinks
            )
            return self._out(x, out.to(x.dtype))
        assert batch.prefill is not None, "a step is a decode step or has prefill metadata"
        out = self.backend.prefill(
            qh.to(k_cache.dtype), k_cache, v_cache, batch.prefill, self.scale, self.window, self.sinks
        )
        return self._out(x, out.to(x.dtype))

    def _rope(self, batch: AttnBatch) -> QKVRope:
        w, r = self.w, self.rotary
        return QKVRope((self.h, self.hkv, self.hd), batch.positions, batch.slot_mapping, r.cos, r.sin, w.q_norm,
                       w.k_norm, self.eps)  # fmt: skip

    def _out(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [T, H, hd] -> [T, D]: the output gate if any, then o_proj."""
        w = self.w
        flat = out.reshape(x.shape[0], self.h * self.hd)
        if w.gate is not None:
            flat = flat * torch.sigmoid(F.linear(x, w.gate))
        return linear(flat, w.o, w.o_bias)
