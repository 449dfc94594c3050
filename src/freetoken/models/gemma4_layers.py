"""Gemma-4's blocks at run time (``models/gemma4.py`` reads them): its attention over KV pages and over a window ring
(q/k/v norms, unscaled scores, KV-shared layers), the per-layer input embeddings, the MoE beside the dense MLP, and
the decoder over them. T = new tokens (all sequences), H / Hkv = query / KV heads, hd = head dim, L = layers,
P = per-layer input dim, D = hidden, E = experts."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from freetoken.cache.kv_pool import KVPool
from freetoken.cache.state_pool import StatePool
from freetoken.kernels.linear import linear
from freetoken.kernels.norm import rms_norm
from freetoken.layers.attention import Attention, AttentionWeights, AttnBatch
from freetoken.layers.mlp import DenseMLP
from freetoken.layers.moe import MoELayer
from freetoken.layers.rope import Rotary
from freetoken.layers.window_attention import BLOCK_ROWS, WindowAttention
from freetoken.models.decoder import DecoderLayer, DecoderModel


class GemmaAttention(Attention):
    """Full attention over the KV pages: q/k RMS-normed per head, v RMS-normed without a scale, scores unscaled (the
    norms set their scale). A KV-shared layer (``reads_only``) computes q only and attends to the pages of its
    source layer (``layer`` is that layer's index in the pool), writing none. The torch q/k/v path (no fused one:
    it has no v norm)."""

    def __init__(self, w: AttentionWeights, layer: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                 rotary: Rotary, reads_only: bool) -> None:  # fmt: skip
        super().__init__(w, layer, num_heads, num_kv_heads, head_dim, eps, rotary)
        self.scale, self._fused_rope, self.reads_only = 1.0, False, reads_only
        self.v_norm = torch.ones(head_dim, dtype=w.q.dtype, device=w.q.device)

    def _qkv_torch(
        self, qkv: torch.Tensor, batch: AttnBatch, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        T, nq, nk = qkv.shape[0], self.h * self.hd, self.hkv * self.hd
        qh = self.rotary.apply(self._norm(qkv[:, :nq], self.w.q_norm, self.h), batch.positions)
        if self.reads_only:
            return qh
        kh = self.rotary.apply(self._norm(qkv[:, nq : nq + nk], self.w.k_norm, self.hkv), batch.positions)
        vh = rms_norm(qkv[:, nq + nk :].reshape(T, self.hkv, self.hd), self.v_norm, self.eps)
        k_cache.index_copy_(0, batch.slot_mapping, kh.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.slot_mapping, vh.to(v_cache.dtype))
        return qh


# One window attention call of a step: keys, values [B, Hkv, N, hd], mask [B, 1, n, N]
Call = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class GemmaWindowAttention(WindowAttention):
    """Sliding-window attention over a KV ring (``layers/window_attention.py``) with Gemma-4's q/k/v norms and
    unscaled scores. A layer whose window keys a later KV-shared layer reads (``keeps``) records this step's attention
    calls (keys, values, mask) in ``batch.selections[layer]``; the KV-shared layer (``source`` != ``layer``) replays
    them with its own queries: the same keys a step, however the ring moved since."""

    def __init__(self, w: AttentionWeights, ring: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rotary: Rotary, window: int, eps: float, layer: int, source: int, keeps: bool) -> None:  # fmt: skip
        self.q_norm, self.k_norm = w.q_norm, w.k_norm
        super().__init__(replace(w, q_norm=None, k_norm=None), ring, num_heads, num_kv_heads, head_dim, rotary, window)
        self.scale, self.eps, self.layer, self.source, self.keeps = 1.0, eps, layer, source, keeps
        self.v_norm = torch.ones(head_dim, dtype=w.q.dtype, device=w.q.device)
        self._record: list[Call] | None = None

    def forward(self, x: torch.Tensor, batch: AttnBatch, states: StatePool | None) -> torch.Tensor:
        assert states is not None, "a ring window layer needs the state pool"
        T, H, Hkv, hd = x.shape[0], self.h, self.hkv, self.hd
        qkv = linear(x, self.qkv_w)
        assert self.q_norm is not None
        q = self.rotary.apply(rms_norm(qkv[:, : H * hd].reshape(T, H, hd), self.q_norm, self.eps), batch.positions)
        if self.source != self.layer:
            calls = batch.selections[self.source]
            assert isinstance(calls, list)
            out = self._replay(q, batch, calls)
        else:
            assert self.k_norm is not None
            k = rms_norm(qkv[:, H * hd : (H + Hkv) * hd].reshape(T, Hkv, hd), self.k_norm, self.eps)
            k = self.rotary.apply(k, batch.positions)
            v = rms_norm(qkv[:, (H + Hkv) * hd :].reshape(T, Hkv, hd), self.v_norm, self.eps)
            rk, rv = states.ring_k[self.ring], states.ring_v[self.ring]
            self._record = [] if self.keeps else None
            if batch.decode is not None:
                out = self._decode(q, k.to(rk.dtype), v.to(rv.dtype), batch, rk, rv)
            else:
                out = self._prefill(q, k.to(rk.dtype), v.to(rv.dtype), batch.seqs, rk, rv)
            if self._record is not None:
                batch.selections[self.layer] = self._record
            self._record = None
        return linear(out.reshape(T, H * hd).to(x.dtype), self.w.o)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self._record is not None:
            self._record.append((k, v, mask))
        return super()._attend(q, k, v, mask)

    def _replay(self, q: torch.Tensor, batch: AttnBatch, calls: list[Call]) -> torch.Tensor:
        """The source layer's calls of this step, in its order (one a decode step; one a block of a sequence's
        queries otherwise), over queries ``q`` [T, H, hd] -> [T, H, hd] float32."""
        if batch.decode is not None:
            k, v, mask = calls[0]
            return self._attend(q[:, :, None, :], k, v, mask)[:, :, 0, :]
        out = torch.empty((q.shape[0], self.h, self.hd), dtype=torch.float32, device=q.device)
        it = iter(calls)
        for s in batch.seqs:
            for r0 in range(0, s.q_len, BLOCK_ROWS):
                a, b = s.q_start + r0, s.q_start + min(s.q_len, r0 + BLOCK_ROWS)
                k, v, mask = next(it)
                out[a:b] = self._attend(q[None, a:b].transpose(1, 2), k, v, mask)[0].transpose(0, 1)
        return out


@dataclass
class PerLayerInputs:
    """Per-layer input embeddings (PLE): ``((norm(proj(h) / sqrt(D)) + table[ids] * sqrt(P)) / sqrt(2)``, per layer.
    The table [V', L*P] lives on the compute device, or in host RAM where it would take too much of the device's
    memory (``models/gemma4.py``): then a step's rows are gathered on the host and copied over (a host read of the
    step's ids: such decode steps run eagerly, not from a CUDA graph)."""

    table: torch.Tensor  # [V', L*P]
    proj: torch.Tensor  # [L*P, D]
    norm: torch.Tensor  # [P]
    num_layers: int
    dim: int
    hidden: int
    eps: float

    def compute(self, ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """ids [T], the scaled embeddings h [T, D] -> [T, L, P]."""
        T, L, P = ids.shape[0], self.num_layers, self.dim
        if self.table.device == ids.device:
            rows = F.embedding(ids, self.table)
        else:  # the table in host RAM
            rows = F.embedding(ids.cpu(), self.table).to(ids.device, non_blocking=True)
        tok = rows.view(T, L, P) * torch.tensor(P**0.5, dtype=self.table.dtype)
        ctx = rms_norm((linear(h, self.proj) * self.hidden**-0.5).view(T, L, P), self.norm, self.eps)
        return (ctx + tok) * 2**-0.5


@dataclass
class GemmaMoE:
    """The routed experts beside the dense MLP: routed on the unscaled norm of the residual (``layer.router`` holds
    the folded ``router.scale``), run on ``pre_norm(h)``; ``post_mlp_norm`` / ``post_norm`` norm the two outputs."""

    layer: MoELayer  # its router, top-k (renormalised) and backend
    per_expert_scale: torch.Tensor  # [E] float32
    post_mlp_norm: torch.Tensor  # post_feedforward_layernorm_1
    pre_norm: torch.Tensor  # pre_feedforward_layernorm_2
    post_norm: torch.Tensor  # post_feedforward_layernorm_2
    unit: torch.Tensor  # [D] ones: the router's norm has no scale

    def forward(self, h: torch.Tensor, eps: float) -> torch.Tensor:
        ids, w = self.layer.route(rms_norm(h, self.unit, eps))
        w = w * self.per_expert_scale[ids]
        return self.layer.backend.forward(self.layer.moe_index, rms_norm(h, self.pre_norm, eps), ids, w)


@dataclass
class GemmaLayer(DecoderLayer):
    """``attn_norm``: input_layernorm; ``ffn_norm``: pre_feedforward_layernorm; ``ffn``: the dense MLP."""

    post_attn_norm: torch.Tensor
    post_ffn_norm: torch.Tensor
    moe: GemmaMoE | None
    ple: tuple[torch.Tensor, ...] | None  # gate [P, D], projection [D, P], norm [D]
    scalar: torch.Tensor  # [1] layer_scalar


class GemmaModel(DecoderModel):
    def __init__(self, embed: torch.Tensor, layers: list[GemmaLayer], final_norm: torch.Tensor, lm_head: torch.Tensor,
                 eps: float, ple: PerLayerInputs | None, softcap: float | None) -> None:  # fmt: skip
        super().__init__(embed, list(layers), final_norm, lm_head, eps)
        self.glayers, self.ple, self.softcap = layers, ple, softcap
        self.embed_scale = torch.tensor(embed.shape[1] ** 0.5, dtype=embed.dtype)  # rounded as transformers does

    def start(self, input_ids: torch.Tensor, batch: AttnBatch) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.embedding(input_ids, self.embed) * self.embed_scale
        if self.ple is not None:
            batch.per_layer = self.ple.compute(input_ids, h)
        return h, rms_norm(h, self.glayers[0].attn_norm, self.eps)

    def block(
        self, i: int, h: torch.Tensor, x: torch.Tensor, batch: AttnBatch, kv: KVPool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lay, eps = self.glayers[i], self.eps
        h = h + rms_norm(self.mix(lay, x, batch, kv), lay.post_attn_norm, eps)
        assert isinstance(lay.ffn, DenseMLP)
        m = lay.ffn.forward(rms_norm(h, lay.ffn_norm, eps))
        if lay.moe is not None:
            m = rms_norm(m, lay.moe.post_mlp_norm, eps) + rms_norm(lay.moe.forward(h, eps), lay.moe.post_norm, eps)
        h = h + rms_norm(m, lay.post_ffn_norm, eps)
        if lay.ple is not None:
            assert batch.per_layer is not None, "Gemma-4's per-layer inputs are set by start()"
            gate, proj, norm = lay.ple
            g = F.gelu(linear(h, gate), approximate="tanh") * batch.per_layer[:, i, :]
            h = h + rms_norm(linear(g, proj), norm, eps)
        h = h * lay.scalar
        after = self.glayers[i + 1].attn_norm if i + 1 < len(self.glayers) else self.final_norm
        return h, rms_norm(h, after, eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = linear(hidden, self.lm_head).float()
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out
