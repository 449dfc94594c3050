"""DeepSeek-V4's decoder: the ``DecoderModel`` contract (``forward``, ``start``, ``block``, ``logits``) over
``n`` residual streams (``layers/hyper_connections.py``). The residual ``h`` is [T, n, D] (the embedding copied into
every stream); each layer collapses the streams into its attention's input and spreads its output back, then the same
around its MoE (routed by token id on the hash layers: the ids ride on the batch, and the backend hears those layers'
experts before the first layer runs: ``V4MoE.prefetch``; in a captured decode step its plan, locks and side-stream
copies are graph nodes, so every replay fills ahead too); after the last layer the head
collapses the streams and the final norm follows. ``block`` returns ``(h, h)`` except after the last layer, where the
second is the final hidden [T, D] (what a layer-major pass hands back)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.cache.kv_pool import KVPool
from freetoken.layers.attention import AttnBatch
from freetoken.layers.hyper_connections import HyperConnection, HyperHead, v4_rms_norm
from freetoken.layers.v4_attention import V4Attention
from freetoken.layers.v4_moe import V4MoE
from freetoken.models.decoder import DecoderLayer, DecoderModel


@dataclass
class V4Layer(DecoderLayer):
    attn_hc: HyperConnection | None = None
    ffn_hc: HyperConnection | None = None


class V4DecoderModel(DecoderModel):
    step_capturable = True  # a decode step's attention is fixed-shape device work (``layers/v4_decode.py``)

    def __init__(
        self, embed: torch.Tensor, layers: list[V4Layer], final_norm: torch.Tensor, lm_head: torch.Tensor, eps: float,
        head: HyperHead, streams: int,
    ) -> None:  # fmt: skip
        super().__init__(embed, list(layers), final_norm, lm_head, eps)
        self.v4_layers, self.head, self.streams = layers, head, streams

    def start(self, input_ids: torch.Tensor, batch: AttnBatch) -> tuple[torch.Tensor, torch.Tensor]:
        batch.input_ids = input_ids
        h = F.embedding(input_ids, self.embed)[:, None].expand(-1, self.streams, -1).contiguous()  # [T, n, D]
        return h, h

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, batch: AttnBatch, kv: KVPool) -> torch.Tensor:
        h, x = self.start(input_ids, batch)
        if not self.layers:
            return v4_rms_norm(self.head.collapse(h), self.final_norm, self.eps)
        for layer in self.v4_layers:  # hash layers: their experts fill while the first layers compute (captured too)
            if isinstance(layer.ffn, V4MoE) and layer.ffn.tid2eid is not None:
                layer.ffn.prefetch(input_ids)
        for i in range(len(self.layers)):
            h, x = self.block(i, h, x, batch, kv)
        return x

    def block(
        self, i: int, h: torch.Tensor, x: torch.Tensor, batch: AttnBatch, kv: KVPool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.v4_layers[i]
        assert layer.attn_hc is not None and layer.ffn_hc is not None and isinstance(layer.attn, V4Attention)
        assert isinstance(layer.ffn, V4MoE)
        post, comb, col = layer.attn_hc.weights(h)
        out = layer.attn.forward(v4_rms_norm(col, layer.attn_norm, self.eps), batch, kv, self.states)
        h = HyperConnection.merge(h, out, post, comb)
        post, comb, col = layer.ffn_hc.weights(h)
        out = layer.ffn.forward_ids(v4_rms_norm(col, layer.ffn_norm, self.eps), batch.input_ids)
        h = HyperConnection.merge(h, out, post, comb)
        if i + 1 < len(self.layers):
            return h, h
        return h, v4_rms_norm(self.head.collapse(h), self.final_norm, self.eps)
