"""The MLA kind's backends (``registry.py``: ``select_mla``): the torch reference everywhere
(``mla_reference.py``), and on CUDA the Triton absorbed decode over paged latents (``mla_triton_decode.py``) with
the reference's expanded prefill."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from freetoken.kernels.attention.mla_reference import mla_decode_reference, mla_prefill_reference

if TYPE_CHECKING:
    from freetoken.kernels.attention import DecodeMeta, PrefillMeta


class TorchMLA:
    name = "torch"

    def decode(self, q: torch.Tensor, cache: torch.Tensor, meta: DecodeMeta, scale: float, rank: int) -> torch.Tensor:
        return mla_decode_reference(q, cache, meta, scale, rank)

    def prefill(
        self, q: torch.Tensor, cache: torch.Tensor, kv_b: torch.Tensor, meta: PrefillMeta, scale: float,
        dims: tuple[int, int],
    ) -> torch.Tensor:  # fmt: skip
        return mla_prefill_reference(q, cache, kv_b, meta, scale, dims)


class TritonMLA(TorchMLA):
    name = "triton"

    def decode(self, q: torch.Tensor, cache: torch.Tensor, meta: DecodeMeta, scale: float, rank: int) -> torch.Tensor:
        from freetoken.kernels.attention.mla_triton_decode import mla_decode_triton

        return mla_decode_triton(q, cache, meta, scale, rank)
