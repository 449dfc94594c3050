"""The in-repo Triton backend (CUDA): split-KV paged decode, varlen paged prefill, and the fused q/k-norm + rotary +
KV-write kernels (``triton_decode.py``, ``triton_prefill.py``, ``qkv_rope_triton.py``). Triton is imported on first
use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from freetoken.kernels.attention.backend import Caches, QKVRope

if TYPE_CHECKING:
    from freetoken.kernels.attention import DecodeMeta, PrefillMeta


class TritonAttention:
    name = "triton"

    def decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: DecodeMeta, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        from freetoken.kernels.attention.triton_decode import paged_decode_triton

        return paged_decode_triton(q, k_cache, v_cache, meta, scale, window, sinks=sinks)

    def prefill(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PrefillMeta, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        from freetoken.kernels.attention.triton_prefill import paged_prefill_triton

        return paged_prefill_triton(q, k_cache, v_cache, meta, scale, window, sinks)

    def decode_fused(
        self, qkv: torch.Tensor, rope: QKVRope, caches: Caches, meta: DecodeMeta, scale: float, window: int | None,
        checked: bool, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor | None:  # fmt: skip
        from freetoken.kernels.attention.triton_decode import paged_decode_rope_triton

        H, _, hd = rope.heads
        return paged_decode_rope_triton(
            qkv, rope.positions, rope.slot_mapping, rope.cos, rope.sin, rope.q_norm, rope.k_norm, rope.eps,
            caches[0], caches[1], meta, H, hd, scale, window, sinks=sinks,
        )  # fmt: skip

    def qkv_rope(self, qkv: torch.Tensor, rope: QKVRope, caches: Caches) -> torch.Tensor | None:
        from freetoken.kernels.attention.qkv_rope_triton import qkv_rope_triton

        H, Hkv, hd = rope.heads
        return qkv_rope_triton(
            qkv, rope.positions, rope.slot_mapping, rope.cos, rope.sin, rope.q_norm, rope.k_norm, caches[0],
            caches[1], H, Hkv, hd, rope.eps,
        )  # fmt: skip
