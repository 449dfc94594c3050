"""Gated DeltaNet (Qwen3-Next, Qwen3.5): a linear-attention token mixer whose per-request state (the last K-1 conv
inputs and the delta-rule state) lives in a ``StatePool`` slot, read and written in place.

x -> one projection to the conv channels (q, k, v), z, b, a -> short causal conv + SiLU over q/k/v -> L2-normalised
q/k (repeated from Hk key heads to H value heads), ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``
-> the gated delta rule (``gated_delta.py``) -> RMSNorm per head gated by SiLU(z) -> out_proj.
Decode steps (one token per sequence, every sequence) run batched from ``batch.state_slots`` with no host read (a
CUDA graph captures them); other steps run per sequence in chunks. T = tokens in the step, D = hidden, C = conv
channels (2*Hk*dk + H*dv).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.cache.state_pool import StatePool
from freetoken.layers.attention import AttnBatch, SeqAttn
from freetoken.layers.gated_delta import (
    causal_conv,
    causal_conv_step,
    chunk_gated_delta,
    l2norm,
    recurrent_gated_delta,
)
from freetoken.layers.norm import rms_norm


@dataclass
class DeltaNetWeights:
    in_proj: torch.Tensor  # [C + H*dv + 2*H, D]: q, k, v (the conv's channels), then z, b, a
    conv: torch.Tensor  # [C, K]
    A_log: torch.Tensor  # [H] float32
    dt_bias: torch.Tensor  # [H] float32
    norm: torch.Tensor  # [dv] (plain w, not 1 + w)
    out: torch.Tensor  # [D, H*dv]


class GatedDeltaNet:
    def __init__(
        self, w: DeltaNetWeights, layer: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int, eps: float
    ) -> None:
        self.w, self.layer, self.eps = w, layer, eps  # layer: its index among the pool's layers
        self.hk, self.h, self.dk, self.dv = k_heads, v_heads, k_dim, v_dim
        self.channels = 2 * k_heads * k_dim + v_heads * v_dim

    def forward(self, x: torch.Tensor, batch: AttnBatch, states: StatePool | None) -> torch.Tensor:
        assert states is not None, "a linear-attention layer needs the state pool"
        T, H, dv = x.shape[0], self.h, self.dv
        mixed, z, b, a = F.linear(x, self.w.in_proj).split([self.channels, H * dv, H, H], dim=-1)
        beta = torch.sigmoid(b).float()
        g = -self.w.A_log.exp() * F.softplus(a.float() + self.w.dt_bias)  # [T, H]
        if batch.decode is not None:
            core = self._decode(mixed, g, beta, batch, states)
        else:
            core = torch.empty((T, H, dv), dtype=torch.float32, device=x.device)
            for s in batch.seqs:
                rows = slice(s.q_start, s.q_start + s.q_len)
                core[rows] = self._sequence(mixed[rows], g[rows], beta[rows], s, states)
        normed = rms_norm(core.to(x.dtype), self.w.norm, self.eps) * F.silu(z.view(T, H, dv).float())
        return F.linear(normed.to(x.dtype).reshape(T, H * dv), self.w.out)

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv output [n, C] -> q, k [n, H, dk] (normalised, q scaled) and v [n, H, dv], float32."""
        n, hk, dk = qkv.shape[0], self.hk, self.dk
        q, k, v = qkv.float().split([hk * dk, hk * dk, self.h * self.dv], dim=-1)
        rep = self.h // hk
        q = l2norm(q.view(n, hk, dk)).repeat_interleave(rep, dim=1) * dk**-0.5
        k = l2norm(k.view(n, hk, dk)).repeat_interleave(rep, dim=1)
        return q, k, v.view(n, self.h, self.dv)

    def _sequence(
        self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, s: SeqAttn, states: StatePool
    ) -> torch.Tensor:
        """One sequence's new tokens; it continues from its slot unless it starts at position 0. The states after
        the tokens ``s.captures`` name go into their checkpoint slots on the way."""
        L = self.layer
        conv, ssm = states.conv[L, s.state_slot], states.ssm[L, s.state_slot]
        fresh = s.start == 0  # position 0 is among the new tokens
        prev = torch.zeros_like(conv) if fresh else conv
        out, last = causal_conv(mixed, prev, self.w.conv)
        q, k, v = self._heads(out)
        state = torch.zeros_like(ssm) if fresh else ssm
        if not s.captures:
            core, state = chunk_gated_delta(q, k, v, g, beta, state)
        else:  # in segments cut at the captures (the conv inputs kept before each: xs[:, off : off + K-1])
            xs = torch.cat([prev.to(mixed.dtype), mixed.transpose(0, 1)], dim=1)
            parts, start = [], 0
            for off, slot in [*sorted(s.captures), (s.q_len, -1)]:
                if off > start:
                    part, state = chunk_gated_delta(q[start:off], k[start:off], v[start:off], g[start:off],
                                                    beta[start:off], state)  # fmt: skip
                    parts.append(part)
                    start = off
                if slot >= 0:
                    states.conv[L, slot].copy_(xs[:, off : off + conv.shape[1]])
                    states.ssm[L, slot].copy_(state)
            core = torch.cat(parts)
        conv.copy_(last)
        ssm.copy_(state)
        return core

    def _decode(
        self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, batch: AttnBatch, states: StatePool
    ) -> torch.Tensor:
        """One token per sequence, batched; a sequence at position 0 starts from zeros (masked, no branch)."""
        slots = batch.state_slots
        assert slots is not None, "a decode step over linear-attention layers needs state slots"
        keep = (batch.positions > 0)[:, None, None]  # [B, 1, 1]
        conv_pool, ssm_pool = states.conv[self.layer], states.ssm[self.layer]
        out, last = causal_conv_step(mixed, conv_pool[slots] * keep.to(conv_pool.dtype), self.w.conv)
        conv_pool.index_copy_(0, slots, last.to(conv_pool.dtype))
        q, k, v = self._heads(out)
        core, state = recurrent_gated_delta(q, k, v, g, beta, ssm_pool[slots] * keep[..., None])
        ssm_pool.index_copy_(0, slots, state)
        return core
