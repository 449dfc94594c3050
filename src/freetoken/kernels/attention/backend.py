"""What an attention backend offers the attention layer (``layers/attention.py``), and the per-step inputs of its
fused q/k-norm + rotary + KV-write paths. Shapes: B sequences (decode), T new tokens (flattened), H / Hkv query / KV
heads, hd head dim; caches are ``(k_cache, v_cache)``, each [slots, Hkv, hd] (slot = page * page_size + offset).
MLA (``MLABackend``): R = kv_lora_rank, dr = qk_rope_head_dim, dn / dv = per-head no-rope key / value dims; its cache
is [slots, 1, R + dr], one latent row per token (the normed compressed K/V, then the rotated shared key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from freetoken.kernels.attention import DecodeMeta, PrefillMeta

Caches = tuple[torch.Tensor, torch.Tensor]


@dataclass(slots=True)
class QKVRope:
    """A step's inputs to the fused paths after the QKV GEMM: per-head q/k RMSNorms, rotary, the new K/V rows."""

    heads: tuple[int, int, int]  # H, Hkv, hd
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64 the new K/V rows' flat slots
    cos: torch.Tensor  # [max_pos, rot] float32 rotary tables
    sin: torch.Tensor
    q_norm: torch.Tensor | None  # [hd] per-head weights, or none
    k_norm: torch.Tensor | None
    eps: float


class AttentionBackend(Protocol):
    """One attention implementation over the paged KV pool. ``decode`` and ``prefill`` always run; the fused paths
    return None where this backend has none for the inputs (the layer then runs its torch q/k/rope/KV write and
    ``decode``/``prefill``)."""

    name: str

    def decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: DecodeMeta, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """q [B, H, hd] (one new token per sequence) over its pages -> [B, H, hd] in q's dtype."""
        ...

    def prefill(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PrefillMeta, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """q [T, H, hd], every new token causally over its sequence's context (never T x T) -> [T, H, hd]."""
        ...

    def decode_fused(
        self, qkv: torch.Tensor, rope: QKVRope, caches: Caches, meta: DecodeMeta, scale: float, window: int | None,
        checked: bool, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor | None:  # fmt: skip
        """A decode step from its QKV projection [B, (H + 2 Hkv) hd]: norms, rotary, the K/V rows written, attention
        -> [B, H, hd]; or None. ``checked``: an earlier layer of this step passed the step's metadata already."""
        ...

    def qkv_rope(self, qkv: torch.Tensor, rope: QKVRope, caches: Caches) -> torch.Tensor | None:
        """Norms, rotary and the K/V rows written from the QKV projection [T, (H + 2 Hkv) hd] -> q [T, H, hd]; or
        None."""
        ...


class MLABackend(Protocol):
    """Multi-head latent attention over paged latents (``layers/mla.py``)."""

    name: str

    def decode(self, q: torch.Tensor, cache: torch.Tensor, meta: DecodeMeta, scale: float, rank: int) -> torch.Tensor:
        """Absorbed decode: q [B, H, R + dr] (the no-rope query through kv_b_proj's key rows, then the rotated
        query) over each sequence's latents, as MQA whose values are the latents' first ``rank`` columns ->
        [B, H, R] in q's dtype (the caller applies kv_b_proj's value rows)."""
        ...

    def prefill(
        self, q: torch.Tensor, cache: torch.Tensor, kv_b: torch.Tensor, meta: PrefillMeta, scale: float,
        dims: tuple[int, int],
    ) -> torch.Tensor:  # fmt: skip
        """q [T, H, dn + dr], every new token causally over its sequence's context, K/V expanded from the latents
        through ``kv_b`` [H * (dn + dv), R] (``dims`` = (dn, dv)) -> [T, H, dv]."""
        ...
