"""Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash) over paged latents.

The KV pool keeps one row per token and layer (``cache/kv_pool.py``, ``memory/sizes.py``): the compressed K/V
``c = kv_a_layernorm(kv_a_proj_with_mqa(x)[:R])`` [R] and the rotated shared key ``kr`` [dr]. The query comes from
``q_b_proj(q_a_layernorm(q_a_proj(x)))`` (or a plain ``q_proj``), per head a no-rope part [dn] and a rope part [dr].
kv_b_proj holds per head the key rows ``W_UK`` [dn, R] and the value rows ``W_UV`` [dv, R].

- Decode steps absorb kv_b_proj (as FlashInfer's and SGLang's MLA decode do): ``q_lat = W_UK^T q_nope`` [R] per
  head, the MLA backend's MQA over the latents (``kernels/attention``'s MLA kind: Triton on CUDA, the torch
  reference elsewhere) gives ``o_lat`` [R], and ``W_UV o_lat`` [dv] goes to o_proj: no per-head K/V is ever made.
- Prefill and mixed steps expand each sequence's latents into per-head K/V through kv_b_proj (the backend's
  ``prefill``): chunked prefill and prefix reuse read the latents earlier steps wrote, as GQA reads K/V.

Rotary is the rotate-half convention on the rope part only; DeepSeek's interleaved layout (``rope_interleave``) is
turned into it at load by permuting the rope rows of the q and kv_a projections (``models/mla_blocks.py``): the
scores are the same. With ``rope`` off (Kimi-Linear's NoPE latent attention) no position encoding is applied at all.
T = new tokens (flattened), H = heads, R = kv_lora_rank, dr = qk_rope_head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.kernels.attention.registry import select_mla
from freetoken.kernels.linear import linear
from freetoken.kernels.norm import rms_norm
from freetoken.layers.attention import AttnBatch
from freetoken.layers.rope import Rotary


@dataclass(frozen=True)
class MLADims:
    heads: int
    rank: int  # kv_lora_rank R
    rope_dim: int  # qk_rope_head_dim dr
    nope_dim: int  # qk_nope_head_dim dn
    v_dim: int  # v_head_dim dv


@dataclass
class MLAWeights:
    kv_a: torch.Tensor  # [R + dr, D] kv_a_proj_with_mqa (its rope rows in rotate-half order)
    kv_a_norm: torch.Tensor  # [R]
    kv_b: torch.Tensor  # [H * (dn + dv), R]
    o: torch.Tensor  # [D, H * dv]
    q: torch.Tensor | None = None  # [H * (dn + dr), D] q_proj (no q_lora_rank)
    q_a: torch.Tensor | None = None  # [q_lora_rank, D]
    q_a_norm: torch.Tensor | None = None  # [q_lora_rank]
    q_b: torch.Tensor | None = None  # [H * (dn + dr), q_lora_rank]
    q_a_bias: torch.Tensor | None = None
    kv_a_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None


class MLAttention:
    def __init__(
        self, w: MLAWeights, layer: int, dims: MLADims, eps: float, rotary: Rotary, scale: float,
        backend: str = "auto", rope: bool = True,
    ) -> None:  # fmt: skip
        self.w, self.layer, self.dims, self.eps, self.rotary, self.scale = w, layer, dims, eps, rotary, scale
        self.rope = rope  # False: no position encoding at all, the "rope" parts as they are (Kimi-Linear)
        self.backend = select_mla(w.kv_a.device, backend)
        H, R, dn, dv = dims.heads, dims.rank, dims.nope_dim, dims.v_dim
        per_head = w.kv_b.view(H, dn + dv, R)
        self.w_uk = per_head[:, :dn].contiguous()  # [H, dn, R]: q_nope -> q_lat
        self.w_uv_t = per_head[:, dn:].transpose(1, 2).contiguous()  # [H, R, dv]: o_lat -> o
        # x's projections in one GEMM: (q_a | kv_a) with a q LoRA, else (q | kv_a)
        first = w.q_a if w.q_a is not None else w.q
        assert first is not None, "MLA needs q_proj or q_a_proj"
        self.nq = first.shape[0]
        self.in_w = torch.cat((first, w.kv_a))
        biases = (w.q_a_bias, w.kv_a_bias)
        self.in_b = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else w.kv_a.new_zeros(n) for b, n in zip(biases, (self.nq, w.kv_a.shape[0]))]
        )  # fmt: skip

    def project(
        self, x: torch.Tensor, batch: AttnBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, D] -> (q_nope [T, H, dn], rotated q_rope [T, H, dr], the q LoRA's normed residual [T, q_lora_rank]
        (the q input where there is no LoRA), the latent rows [T, R + dr] the pool keeps)."""
        d, w, T = self.dims, self.w, x.shape[0]
        H, R, dn = d.heads, d.rank, d.nope_dim
        proj = linear(x, self.in_w, self.in_b)
        q_in, kv_a = proj[:, : self.nq], proj[:, self.nq :]
        if w.q_b is not None:
            assert w.q_a_norm is not None
            q_in = rms_norm(q_in, w.q_a_norm, self.eps)
        q = (linear(q_in, w.q_b) if w.q_b is not None else q_in).view(T, H, dn + d.rope_dim)
        q_rope = self.rotary.apply(q[..., dn:], batch.positions) if self.rope else q[..., dn:]
        c = rms_norm(kv_a[:, :R], w.kv_a_norm, self.eps)
        kr = self.rotary.apply(kv_a[:, None, R:], batch.positions)[:, 0] if self.rope else kv_a[:, R:]
        return q[..., :dn], q_rope, q_in, torch.cat((c, kr), dim=-1)

    def absorb(self, q_nope: torch.Tensor, q_rope: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The decode query over the latents: [W_UK^T q_nope, q_rope] [T, H, R + dr]."""
        q_lat = torch.bmm(q_nope.transpose(0, 1), self.w_uk).transpose(0, 1)  # [T, H, R]
        return torch.cat((q_lat, q_rope), dim=-1).to(dtype)

    def out(self, o_lat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A decode's latent output [T, H, R] -> per-head values [T, H, dv] (W_UV)."""
        return torch.bmm(o_lat.to(dtype).transpose(0, 1), self.w_uv_t).transpose(0, 1)

    def forward(self, x: torch.Tensor, batch: AttnBatch, kv: KVPool) -> torch.Tensor:
        d, w, T = self.dims, self.w, x.shape[0]
        H, R, dn = d.heads, d.rank, d.nope_dim
        cache = kv.k[self.layer]  # [slots, 1, R + dr]
        q_nope, q_rope, _, lat = self.project(x, batch)
        cache.index_copy_(0, batch.slot_mapping, lat[:, None].to(cache.dtype))
        if batch.decode is not None:
            o_lat = self.backend.decode(self.absorb(q_nope, q_rope, cache.dtype), cache, batch.decode, self.scale, R)
            o = self.out(o_lat, x.dtype)  # [T, H, dv]
        else:
            assert batch.prefill is not None, "a step is a decode step or has prefill metadata"
            qf = torch.cat((q_nope, q_rope), dim=-1).to(cache.dtype)
            o = self.backend.prefill(qf, cache, w.kv_b, batch.prefill, self.scale, (dn, d.v_dim)).to(x.dtype)
        return linear(o.reshape(T, H * d.v_dim), w.o, w.o_bias)
