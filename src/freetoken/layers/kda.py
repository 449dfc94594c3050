"""Kimi Delta Attention (Kimi-Linear's linear-attention layers): gated DeltaNet (``layers/deltanet.py``) with a decay
per key channel, a low-rank forget gate and a sigmoid-gated output norm. Its per-request state (the last K-1 conv
inputs of q/k/v and the [H, dk, dk] delta-rule state) lives in a ``StatePool`` slot like gated DeltaNet's, and is
checkpointed at the same anchors: the conv over sequences, the cuts at checkpoints and the slot writes are
``GatedDeltaNet``'s own; only the projections, the gates, the rule and the output norm differ.

x -> one projection to q, k, v (the conv's channels), the forget gate's and the output gate's low-rank inputs, and
beta's logits -> short causal conv + SiLU over q/k/v -> L2-normalised q/k, ``beta = sigmoid(b)``,
``g = -exp(A_log) * softplus(f_b(f_a x) + dt_bias)`` [T, H, dk] -> the KDA rule (``kernels/kda.py``) -> RMSNorm per
head times ``sigmoid(g_b(g_a x))`` -> o_proj. Torch on every device (fla's KDA kernels on CUDA are a follow-up).
T = tokens in the step, D = hidden, H heads of dk (keys and values alike), C = 3*H*dk conv channels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.cache.state_pool import StatePool
from freetoken.kernels.kda import chunk_kda, kda_gate, kda_step, sigmoid_gated_rms_norm
from freetoken.layers.attention import AttnBatch
from freetoken.layers.deltanet import DeltaNetWeights, GatedDeltaNet


@dataclass
class KDAWeights(DeltaNetWeights):
    """``in_proj`` [C + 2*dk + H, D]: q, k, v (the conv's channels), f_a, g_a, b; ``conv`` [C, K]; ``A_log`` [H] and
    ``dt_bias`` [H*dk] float32; ``norm`` [dk]; ``out`` [D, H*dk]; and the gates' second halves:"""

    f_b: torch.Tensor  # [H*dk, dk] forget gate
    g_b: torch.Tensor  # [H*dk, dk] output gate


class KimiDeltaAttention(GatedDeltaNet):
    def __init__(self, w: KDAWeights, layer: int, heads: int, head_dim: int, eps: float) -> None:
        # GatedDeltaNet's fields, set here: its constructor would pick fla's gated-delta kernels, which KDA cannot use
        self.w, self.kda, self.layer, self.eps = w, w, layer, eps
        self.hk = self.h = heads
        self.dk = self.dv = head_dim
        self.channels = 3 * heads * head_dim
        self.fla = None

    def forward(self, x: torch.Tensor, batch: AttnBatch, states: StatePool | None) -> torch.Tensor:
        assert states is not None, "a linear-attention layer needs the state pool"
        T, H, d, w = x.shape[0], self.h, self.dk, self.kda
        mixed, f_a, g_a, b = F.linear(x, w.in_proj).split([self.channels, d, d, H], dim=-1)
        g = kda_gate(F.linear(f_a, w.f_b), w.A_log, w.dt_bias, H)  # [T, H, dk] float32
        if batch.decode is not None:
            assert batch.state_slots is not None, "a decode step over linear-attention layers needs state slots"
            L = self.layer
            core = kda_step(mixed, g, b, states.conv[L], states.ssm[L], batch.state_slots, batch.positions, w.conv)
        else:
            convolved = self._conv(mixed, batch.seqs, states)
            core = self._chunks(convolved, g, torch.sigmoid(b).float(), batch.seqs, states)
        gate = F.linear(g_a, w.g_b).view(T, H, d)
        normed = sigmoid_gated_rms_norm(core, gate, w.norm, self.eps)
        return F.linear(normed.reshape(T, H * d), w.out)

    def _rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        return chunk_kda(q, k, v, g, beta, state)
