"""Paged attention over the KV pool, behind one interface: decode and (varlen, causal) prefill.

``decode_attention(q, k_cache, v_cache, meta, scale, window)``: one new token per sequence, each
attending to its whole context through its page table, read in place. Backends: the in-repo Triton
kernel (CUDA; split-KV, the path every GPU figure is measured on) and the torch reference (CPU, tests,
and anywhere Triton is missing). ``prefill_attention``: every new token of a prefill or mixed step over
its sequence's context, the same two backends (``triton_prefill.py``, ``prefill_reference.py``). Shapes:
B sequences, H query heads, Hkv KV heads, hd head dim, P pages per sequence at most, S tokens per page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from freetoken.experts.triton_support import triton_available


@dataclass
class DecodeMeta:
    """What a decode step's attention needs, shared by every layer (static buffers under CUDA graphs)."""

    block_table: torch.Tensor  # [B, P] int32 page ids (entries past a sequence's pages are ignored; CUDA: or int64)
    seq_lens: torch.Tensor  # [B] int32 context length, the new token included (CUDA: or int64)
    page_size: int
    gathered: dict[int | None, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """The torch reference's slots and mask per window on a CPU, made by the first layer, reused by the others."""


@dataclass
class PrefillMeta:
    """A prefill (or mixed) step's attention metadata: per sequence its rows of new tokens in the flattened
    step and its context through the page table (the new tokens included, their K/V written already)."""

    q_start: torch.Tensor  # [S] int32 first row of the sequence's new tokens
    q_len: torch.Tensor  # [S] int32 new tokens
    ctx_len: torch.Tensor  # [S] int32 context length after this step
    block_table: torch.Tensor  # [S, P] int32
    page_size: int
    max_q_len: int  # host copy of q_len.max() (sizes the grid)


def prefill_attention(
    q: torch.Tensor,  # [T, H, hd]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PrefillMeta,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of every new token over its sequence's context, never T x T: the Triton kernel (CUDA),
    else the torch reference in blocks of query rows."""
    if q.is_cuda and triton_available():
        from freetoken.layers.paged_attention.triton_prefill import paged_prefill_triton

        return paged_prefill_triton(q, k_cache, v_cache, meta, scale, window)
    from freetoken.layers.paged_attention.prefill_reference import paged_prefill_reference

    return paged_prefill_reference(q, k_cache, v_cache, meta, scale, window)


def decode_attention(
    q: torch.Tensor,  # [B, H, hd]
    k_cache: torch.Tensor,  # [slots, Hkv, hd] (slot = page * S + offset)
    v_cache: torch.Tensor,
    meta: DecodeMeta,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [B, H, hd], q's dtype
    if q.is_cuda and triton_available():
        from freetoken.layers.paged_attention.triton_decode import paged_decode_triton

        return paged_decode_triton(q, k_cache, v_cache, meta, scale, window)
    from freetoken.layers.paged_attention.reference import paged_decode_reference

    return paged_decode_reference(q, k_cache, v_cache, meta, scale, window)
