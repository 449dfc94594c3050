"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5): multi-head latent attention (``layers/mla.py``) whose every
query attends only the ``index_topk`` context positions a lightning indexer picks.

The indexer (transformers' ``DeepseekV32Indexer``): per token a key ``ik = rope(LayerNorm(wk x))`` [Di], cached in the
KV pool's row beside the latent (``memory/sizes.py``: the row is ``R + dr + Di`` wide); per query ``Hi`` heads
``iq = rope(wq_b q_resid)`` [Hi, Di] from the q LoRA's normed residual, and head weights ``weights_proj x`` [Hi].
Rotary turns the first ``dr`` dims of the indexer's q and k (rotate-half; GLM-5's interleaved layout is permuted into it
at load, ``models/dsa_blocks.py``). The scoring, selection and sparse attention are
``kernels/attention/dsa_reference.py``'s; decode and prefill are both absorbed as MLA's decode is (each query reads
at most ``index_topk`` latents; on CUDA the scores come from Triton, ``index_triton.py``, and MLA's Triton decode
kernel attends the kept latents, a new token a row, in decode and prefill alike: ``dsa_triton.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.cache.kv_pool import KVPool
from freetoken.kernels.attention.dsa_reference import (
    decode_selection,
    dense_meta,
    dsa_decode_reference,
    dsa_prefill_reference,
    prefill_selection,
)
from freetoken.kernels.linear import linear
from freetoken.kernels.triton_support import use_triton
from freetoken.layers.attention import AttnBatch
from freetoken.layers.mla import MLADims, MLAttention, MLAWeights
from freetoken.layers.rope import Rotary

INDEXER_NORM_EPS = 1e-6  # the indexer's k_norm (a LayerNorm built with eps=1e-6)


@dataclass
class IndexerWeights:
    wq_b: torch.Tensor  # [Hi * Di, q_lora_rank] (rope rows in rotate-half order)
    wk: torch.Tensor  # [Di, D]
    k_norm: torch.Tensor  # [Di] LayerNorm weight
    k_norm_bias: torch.Tensor  # [Di]
    weights_proj: torch.Tensor  # [Hi, D] float32 (transformers keeps it in float32)
    heads: int  # index_n_heads Hi
    head_dim: int  # index_head_dim Di
    topk: int  # index_topk


class DSAttention(MLAttention):
    """``idx``: this layer's indexer; None on a layer sharing layer ``source``'s selection (GLM-5's "shared" layers:
    the step's selection of the last indexer layer before it, kept on the batch)."""

    scans_table = True  # a decode step's indexer scores every position its page table reaches (``decode_selection``)

    def __init__(
        self, w: MLAWeights, layer: int, dims: MLADims, eps: float, rotary: Rotary, scale: float,
        idx: IndexerWeights | None, source: int, index_dim: int,
    ) -> None:  # fmt: skip
        super().__init__(w, layer, dims, eps, rotary, scale)
        assert w.q_b is not None, "DSA's indexer reads the q LoRA's residual"
        self.idx, self.source, self.index_dim = idx, source, index_dim
        # the head weights' scales folded in: relu(s q.k) = s relu(q.k) for s > 0
        self.head_scale = 0.0 if idx is None else float(idx.heads**-0.5 * idx.head_dim**-0.5)
        self.triton = use_triton(w.kv_a.device)  # Triton scores and sparse attention (``dsa_triton.py``)

    def index_keys(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> the indexer's rotated keys [T, Di] (zeros on a sharing layer: its rows' keys are unused)."""
        i = self.idx
        if i is None:
            return x.new_zeros((x.shape[0], self.index_dim))
        k = F.layer_norm(linear(x, i.wk), (i.head_dim,), i.k_norm, i.k_norm_bias, INDEXER_NORM_EPS)
        return self.rotary.apply(k[:, None], positions)[:, 0]

    def select(self, x: torch.Tensor, q_resid: torch.Tensor, batch: AttnBatch, cache: torch.Tensor) -> object:
        """This step's kept positions: the indexer's (kept on the batch for the layers sharing it), or the source's."""
        i = self.idx
        if i is None:
            return batch.selections[self.source]
        iq = self.rotary.apply(linear(q_resid, i.wq_b).view(-1, i.heads, i.head_dim), batch.positions)
        iw = linear(x.float(), i.weights_proj) * self.head_scale
        L = self.dims.rank + self.dims.rope_dim
        if batch.decode is not None:
            select = decode_selection
            if self.triton:  # the scores in Triton
                from freetoken.kernels.attention.dsa_triton import decode_selection_triton as select
            sel: object = select(cache, batch.decode, L, iq, iw, i.topk)
        else:
            assert batch.prefill is not None, "a step is a decode step or has prefill metadata"
            select_rows = prefill_selection
            if self.triton:
                from freetoken.kernels.attention.dsa_triton import prefill_selection_triton as select_rows
            sel = select_rows(cache, batch.prefill, L, iq, iw, i.topk, self.dims.heads)
        batch.selections[self.layer] = sel
        return sel

    def forward(self, x: torch.Tensor, batch: AttnBatch, kv: KVPool) -> torch.Tensor:
        d, w, T = self.dims, self.w, x.shape[0]
        cache = kv.k[self.layer]  # [slots, 1, R + dr + Di]
        q_nope, q_rope, q_resid, lat = self.project(x, batch)
        row = torch.cat((lat, self.index_keys(x, batch.positions)), dim=-1)
        cache.index_copy_(0, batch.slot_mapping, row[:, None].to(cache.dtype))
        sel = self.select(x, q_resid, batch, cache)
        q = self.absorb(q_nope, q_rope, cache.dtype)  # prefill too: each query reads at most topk latents
        if batch.decode is not None:
            assert isinstance(sel, tuple)
            decode = dsa_decode_reference
            if self.triton:
                from freetoken.kernels.attention.dsa_triton import dsa_decode_triton as decode
            o = self.out(decode(q, cache, sel, self.scale, d.rank), x.dtype)  # [T, H, dv]
        else:
            assert isinstance(sel, list) and batch.prefill is not None
            prefill = dsa_prefill_reference
            if self.triton:  # each new token a decode row over its kept latents
                from freetoken.kernels.attention.dsa_triton import dsa_prefill_triton as prefill
            o = self.out(prefill(q, cache, sel, self.scale, d.rank), x.dtype)
            dense = dense_meta(batch.prefill, sel)
            if dense is not None:  # contexts within topk keep all they see: MLA's expanded prefill (its flash kernel)
                qf = torch.cat((q_nope, q_rope), dim=-1).to(cache.dtype)
                od = self.backend.prefill(qf, cache[..., : d.rank + d.rope_dim], w.kv_b, dense, self.scale,
                                          (d.nope_dim, d.v_dim))  # fmt: skip
                for b in sel:
                    if b.slots is None:
                        o[b.start : b.stop] = od[b.start : b.stop].to(o.dtype)
        return linear(o.reshape(T, d.heads * d.v_dim), w.o, w.o_bias)
