"""The CPU backend: the torch reference, except that a float32 decode step whose KV pool is float32 runs its q/k
norms, rotary, KV write and attention in one C++ call (``kernels/cpu_step``) where the library built."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from freetoken.kernels import cpu_step
from freetoken.kernels.attention.backend import Caches, QKVRope
from freetoken.kernels.attention.torch_backend import TorchAttention

if TYPE_CHECKING:
    from freetoken.kernels.attention import DecodeMeta


class CpuAttention(TorchAttention):
    name = "cpu"

    def decode_fused(
        self, qkv: torch.Tensor, rope: QKVRope, caches: Caches, meta: DecodeMeta, scale: float, window: int | None,
        checked: bool, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor | None:  # fmt: skip
        if not cpu_step.available(qkv) or caches[0].dtype != qkv.dtype or sinks is not None:  # no sinks in C++
            return None
        H, _, hd = rope.heads
        out = cpu_step.decode_attention(
            qkv, rope.heads, (rope.q_norm, rope.k_norm, rope.eps), (rope.cos, rope.sin), rope.positions,
            rope.slot_mapping, caches, meta.block_table, meta.seq_lens, meta.page_size, scale, window, checked,
        )  # fmt: skip
        return out.view(qkv.shape[0], H, hd)
