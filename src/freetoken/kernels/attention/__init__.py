"""Paged attention over the KV pool behind the attention-backend registry (``registry.py``; the interface in
``backend.py``): decode (one new token per sequence, each attending to its whole context through its page table,
read in place) and varlen causal prefill. Backends: the in-repo Triton kernels (CUDA; split-KV decode, the path every
GPU figure is measured on), the torch reference (``decode_reference.py``, ``prefill_reference.py``: everywhere, and
the tests' oracle) and the CPU backend (the reference plus a C++ fused decode). This module holds the step metadata
every backend reads. Shapes: B sequences, H query heads, Hkv KV heads, hd head dim, P pages per sequence at most,
S tokens per page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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

