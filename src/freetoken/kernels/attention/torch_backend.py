"""The torch reference backend: gather each sequence's pages, then SDPA (``decode_reference.py``,
``prefill_reference.py``). Runs on every device; no fused paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from freetoken.kernels.attention.backend import Caches, QKVRope
from freetoken.kernels.attention.decode_reference import paged_decode_reference
from freetoken.kernels.attention.prefill_reference import paged_prefill_reference

if TYPE_CHECKING:
    from freetoken.kernels.attention import DecodeMeta, PrefillMeta


class TorchAttention:
    name = "torch"

    def decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: DecodeMeta, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        return paged_decode_reference(q, k_cache, v_cache, meta, scale, window, sinks)

    def prefill(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PrefillMeta, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        return paged_prefill_reference(q, k_cache, v_cache, meta, scale, window, sinks)

    def decode_fused(
        self, qkv: torch.Tensor, rope: QKVRope, caches: Caches, meta: DecodeMeta, scale: float, window: int | None,
        checked: bool, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor | None:  # fmt: skip
        return None

    def qkv_rope(self, qkv: torch.Tensor, rope: QKVRope, caches: Caches) -> torch.Tensor | None:
        return None
