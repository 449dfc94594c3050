"""The decoder every family composes: embeddings, N x (attention + dense MLP or MoE), final norm, head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.cache.kv_pool import KVPool
from freetoken.cache.state_pool import StatePool
from freetoken.kernels.linear import linear
from freetoken.kernels.norm import add_rms_norm, embed_rms_norm, rms_norm
from freetoken.layers.attention import Attention, AttnBatch
from freetoken.layers.deltanet import GatedDeltaNet
from freetoken.layers.mla import MLAttention
from freetoken.layers.mlp import DenseMLP
from freetoken.layers.moe import MoELayer
from freetoken.layers.v4_attention import V4Attention
from freetoken.layers.window_attention import WindowAttention

# the token mixer: full attention (GQA or latent) over KV pages, linear attention, or a window over a KV ring (both
# over state slots), or DeepSeek-V4's windowed and compressed attention over KV pages
Mixer = Attention | MLAttention | GatedDeltaNet | WindowAttention | V4Attention


@dataclass
class DecoderLayer:
    attn_norm: torch.Tensor
    attn: Mixer  # the token mixer
    ffn_norm: torch.Tensor
    ffn: DenseMLP | MoELayer


class DecoderModel:
    step_capturable = True  # a decode step may be captured as one CUDA graph (``runner/step_graph.py``)

    def __init__(
        self,
        embed: torch.Tensor,  # [V, D]
        layers: list[DecoderLayer],
        final_norm: torch.Tensor,
        lm_head: torch.Tensor,  # [V, D]
        eps: float,
    ) -> None:
        self.embed, self.layers, self.final_norm, self.lm_head, self.eps = embed, layers, final_norm, lm_head, eps
        self.states: StatePool | None = None  # the linear-attention layers' state slots, set by the engine

    @property
    def scans_table(self) -> bool:
        """Whether a decode step reads every position its page table reaches in torch ops (a mixer's ``scans_table``:
        DSA's indexer, DeepSeek-V4's compressed entries): then its step graphs come per page-table width
        (``runner/step_graph.py``), not at the longest context's."""
        return any(getattr(layer.attn, "scans_table", False) for layer in self.layers)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, batch: AttnBatch, kv: KVPool) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, D]."""
        if not self.layers:
            h = F.embedding(input_ids, self.embed)
            return rms_norm(h, self.final_norm, self.eps)
        h, x = self.start(input_ids, batch)
        for i in range(len(self.layers)):
            h, x = self.block(i, h, x, batch, kv)
        return x

    def start(self, input_ids: torch.Tensor, batch: AttnBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """A chunk's entry: the residual before the first layer and it normed for that layer (``forward`` and
        layer-major passes start here; a family may scale it, widen it or set per-step inputs on ``batch``: Gemma-4,
        DeepSeek-V4)."""
        return embed_rms_norm(input_ids, self.embed, self.layers[0].attn_norm, self.eps)

    def block(
        self, i: int, h: torch.Tensor, x: torch.Tensor, batch: AttnBatch, kv: KVPool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i`` over the residual ``h`` and its normed ``x``: the token mixer, then the MLP or MoE; returns
        the new residual and it normed for the next layer (the final norm after the last)."""
        layer = self.layers[i]
        h, x = add_rms_norm(h, self.mix(layer, x, batch, kv), layer.ffn_norm, self.eps)
        after = self.layers[i + 1].attn_norm if i + 1 < len(self.layers) else self.final_norm
        return add_rms_norm(h, layer.ffn.forward(x), after, self.eps)

    def mix(self, layer: DecoderLayer, x: torch.Tensor, batch: AttnBatch, kv: KVPool) -> torch.Tensor:
        """A layer's token mixer: attention (GQA or latent) over the KV pages, or linear attention or a window ring over
        its state slots."""
        m = layer.attn
        if isinstance(m, GatedDeltaNet | WindowAttention):
            return m.forward(x, batch, self.states)
        if isinstance(m, V4Attention):  # entries in the KV pages, its rows in state rings
            return m.forward(x, batch, kv, self.states)
        return m.forward(x, batch, kv)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, D] -> logits [n, V] in float32 (only rows where a token is sampled)."""
        return linear(hidden, self.lm_head).float()
