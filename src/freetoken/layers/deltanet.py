"""Gated DeltaNet (Qwen3-Next, Qwen3.5): a linear-attention token mixer whose per-request state (the last K-1 conv
inputs and the delta-rule state) lives in a ``StatePool`` slot, read and written in place.

x -> one projection to the conv channels (q, k, v), z, b, a -> short causal conv + SiLU over q/k/v -> L2-normalised
q/k (repeated from Hk key heads to H value heads), ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``
-> the gated delta rule (``kernels/gated_delta.py``) -> RMSNorm per head gated by SiLU(z) -> out_proj.
Decode steps (one token per sequence, every sequence) run batched from ``batch.state_slots`` with no host read (a
CUDA graph captures them) through ``kernels.gated_delta.deltanet_step`` (one Triton launch between the two GEMMs on
CUDA) and the gated norm. Other steps run the conv per sequence, then the
chunked rule: per sequence in torch, or with fla's kernels (``kernels/gated_delta_fla.py``, CUDA 16-bit models) every
sequence in one variable-length launch. A sequence with checkpoints to take is cut into segments at them; fla runs
the r-th segments of all sequences in one launch. T = tokens in the step, N = its sequences, D = hidden, C = conv
channels (2*Hk*dk + H*dv).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.cache.state_pool import StatePool
from freetoken.kernels import gated_delta_fla
from freetoken.kernels.gated_delta import causal_conv, chunk_gated_delta, deltanet_step, gates, heads
from freetoken.kernels.norm import gated_rms_norm
from freetoken.layers.attention import AttnBatch, SeqAttn


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
        device, dtype = w.in_proj.device, w.in_proj.dtype
        self.fla = gated_delta_fla.kernels(device, dtype)  # None: the torch path (prefill)
        if self.fla is not None:
            gated_delta_fla.warm(self.fla, device, dtype, k_heads, v_heads, k_dim, v_dim)

    def forward(self, x: torch.Tensor, batch: AttnBatch, states: StatePool | None) -> torch.Tensor:
        assert states is not None, "a linear-attention layer needs the state pool"
        T, H, dv = x.shape[0], self.h, self.dv
        mixed, z, b, a = F.linear(x, self.w.in_proj).split([self.channels, H * dv, H, H], dim=-1)
        if batch.decode is not None:
            core = self._decode(mixed, b, a, batch, states)
        else:
            g, beta = gates(a, b, self.w.A_log, self.w.dt_bias)  # [T, H]
            convolved = self._conv(mixed, batch.seqs, states)
            if self.fla is not None:
                core = self._chunks_fla(self.fla, convolved, g, beta, batch.seqs, states)
            else:
                core = self._chunks(convolved, g, beta, batch.seqs, states)
        normed = gated_rms_norm(core, z.view(T, H, dv), self.w.norm, self.eps)  # [T, H, dv] x's dtype
        return F.linear(normed.view(T, H * dv), self.w.out)

    def _split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv output [n, C] -> q, k [n, Hk, dk] and v [n, H, dv], as they are (views)."""
        n, hk, dk = qkv.shape[0], self.hk, self.dk
        q, k, v = qkv.split([hk * dk, hk * dk, self.h * self.dv], dim=-1)
        return q.view(n, hk, dk), k.view(n, hk, dk), v.view(n, self.h, self.dv)

    def _conv(self, mixed: torch.Tensor, seqs: list[SeqAttn], states: StatePool) -> torch.Tensor:
        """Every sequence's causal conv from its slot's last inputs (zeros at position 0); the slot then holds its
        new last inputs, and each checkpoint slot ``s.captures`` names the inputs before its token."""
        L, out = self.layer, torch.zeros_like(mixed)
        for s in seqs:
            rows, conv = slice(s.q_start, s.q_start + s.q_len), states.conv[L, s.state_slot]
            prev = torch.zeros_like(conv) if s.start == 0 else conv
            out[rows], last = causal_conv(mixed[rows], prev, self.w.conv)
            if s.captures:
                xs = torch.cat([prev.to(mixed.dtype), mixed[rows].transpose(0, 1)], dim=1)
                for off, slot in s.captures:
                    states.conv[L, slot].copy_(xs[:, off : off + conv.shape[1]])
            conv.copy_(last)
        return out

    def _chunks(
        self, convolved: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, seqs: list[SeqAttn], states: StatePool
    ) -> torch.Tensor:
        """The torch reference, per sequence and segment; the state after each segment goes into the checkpoint
        slots captured there, the last into the sequence's slot."""
        ssm, T = states.ssm[self.layer], convolved.shape[0]
        core = torch.zeros((T, self.h, self.dv), dtype=torch.float32, device=convolved.device)
        for s in seqs:
            rows = slice(s.q_start, s.q_start + s.q_len)
            q, k, v = heads(convolved[rows], self.hk, self.dk, self.h)
            gs, bs = g[rows], beta[rows]
            state = torch.zeros_like(ssm[s.state_slot]) if s.start == 0 else ssm[s.state_slot]
            for slot in _captured_at(s, 0):
                ssm[slot].copy_(state)
            for a, b in _segments(s):
                core[s.q_start + a : s.q_start + b], state = self._rule(q[a:b], k[a:b], v[a:b], gs[a:b], bs[a:b], state)
                for slot in _captured_at(s, b):
                    ssm[slot].copy_(state)
            ssm[s.state_slot].copy_(state)
        return core

    def _rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """One segment of one sequence by the chunked rule in torch (a subclass's own rule: KDA's per-channel decay)."""
        return chunk_gated_delta(q, k, v, g, beta, state)

    def _chunks_fla(
        self, fla: gated_delta_fla.FlaKernels, convolved: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        seqs: list[SeqAttn], states: StatePool,
    ) -> torch.Tensor:  # fmt: skip
        """fla's chunked kernel: round r runs the r-th segment of every sequence that has one, in one launch."""
        ssm, dev = states.ssm[self.layer], convolved.device
        q, k, v = self._split(convolved)
        core = torch.zeros((convolved.shape[0], self.h, self.dv), dtype=convolved.dtype, device=dev)
        if not seqs:
            return core
        slots = torch.tensor([s.state_slot for s in seqs], device=dev)
        fresh = torch.tensor([s.start == 0 for s in seqs], device=dev)[:, None, None, None]
        state = torch.where(fresh, 0.0, ssm.index_select(0, slots))  # [N, H, dk, dv]
        for i, s in enumerate(seqs):
            for slot in _captured_at(s, 0):
                ssm[slot].copy_(state[i])
        segments = [_segments(s) for s in seqs]
        for r in range(max(len(p) for p in segments)):
            active = [i for i, p in enumerate(segments) if len(p) > r]
            spans = [(seqs[i].q_start + segments[i][r][0], seqs[i].q_start + segments[i][r][1]) for i in active]
            rows = _rows(spans, dev)
            init = state if len(active) == len(seqs) else state[active]
            out, final = gated_delta_fla.chunk(
                fla, q[rows], k[rows], v[rows], g[rows], beta[rows], init, [b - a for a, b in spans]
            )
            core[rows] = out
            for j, i in enumerate(active):
                for slot in _captured_at(seqs[i], segments[i][r][1]):
                    ssm[slot].copy_(final[j])
            state = final if len(active) == len(seqs) else state.index_copy(0, torch.tensor(active, device=dev), final)
        ssm.index_copy_(0, slots, state)
        return core

    def _decode(
        self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, batch: AttnBatch, states: StatePool
    ) -> torch.Tensor:
        """One token per sequence, batched; a sequence at position 0 starts from zeros (masked, no branch)."""
        assert batch.state_slots is not None, "a decode step over linear-attention layers needs state slots"
        w, L = self.w, self.layer
        args = (mixed, b, a, states.conv[L], states.ssm[L], batch.state_slots, batch.positions, w.conv, w.A_log,
                w.dt_bias, self.hk, self.dk)  # fmt: skip
        return deltanet_step(*args)


def _segments(s: SeqAttn) -> list[tuple[int, int]]:
    """A sequence's new tokens [0, q_len) cut at its checkpoints' offsets: (start, end) pairs, none empty."""
    cuts = sorted({off for off, _ in s.captures if 0 < off < s.q_len} | {s.q_len})
    return list(zip([0, *cuts[:-1]], cuts))


def _captured_at(s: SeqAttn, off: int) -> list[int]:
    return [slot for o, slot in s.captures if o == off]


def _rows(spans: list[tuple[int, int]], device: torch.device) -> slice | torch.Tensor:
    """The step's rows of consecutive ``spans``: a slice where they touch (one sequence, or a whole step), else an
    index."""
    if all(b0 == a1 for (_, b0), (a1, _) in zip(spans, spans[1:])):
        return slice(spans[0][0], spans[-1][1])
    return torch.cat([torch.arange(a, b) for a, b in spans]).to(device)
