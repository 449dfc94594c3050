"""One batched copy of a round's fills, all banks: pool rows -> slots, indexed by device tensors.

``copy_src``/``copy_dst`` are [Kv] with a valid prefix of ``count`` entries; the rest point at the
scratch slot. CPU: ``index_copy_`` of the valid prefix from the pool (reading ``count`` is free there).
CUDA: a Triton kernel gathers the rows straight from the pinned, mapped host pool (UVA) and skips the
padded entries by reading ``count`` on the device; without Triton the same gather runs as torch ops on
the mapped view (padded rows are copied too: the host cannot read ``count`` without a sync).
"""

from __future__ import annotations

import torch

from freetoken.experts.triton_support import triton_available


def batched_fill_torch(
    src_gate_up: torch.Tensor,  # [N, 2I, D] pool (or its mapped device view)
    src_down: torch.Tensor,  # [N, D, I]
    dst_gate_up: torch.Tensor,  # [S+1, 2I, D] slots
    dst_down: torch.Tensor,  # [S+1, D, I]
    copy_src: torch.Tensor,  # [Kv] int64 pool rows
    copy_dst: torch.Tensor,  # [Kv] int64 slots (padded entries: scratch slot S)
) -> None:
    """Reference: gather + scatter of whole rows (padded entries rewrite the scratch slot)."""
    if copy_src.numel() == 0:
        return
    src_idx = copy_src.to(src_gate_up.device)
    dst_gate_up.index_copy_(0, copy_dst, src_gate_up.index_select(0, src_idx).to(dst_gate_up.device))
    dst_down.index_copy_(0, copy_dst, src_down.index_select(0, src_idx).to(dst_down.device))


def batched_fill(
    src_gate_up: torch.Tensor,
    src_down: torch.Tensor,
    dst_gate_up: torch.Tensor,
    dst_down: torch.Tensor,
    copy_src: torch.Tensor,
    copy_dst: torch.Tensor,
    count: torch.Tensor,  # [] int64 valid entries
) -> None:
    """The round's fills: on CUDA with Triton one gather launch."""
    if dst_gate_up.device.type == "cuda" and triton_available():
        from freetoken.experts.slots.copy_triton import gather_rows_triton

        gather_rows_triton(src_gate_up, src_down, dst_gate_up, dst_down, copy_src, copy_dst, count)
        return
    if dst_gate_up.device.type == "cpu":  # reading the count costs nothing here: skip the padded entries
        n = int(count)
        copy_src, copy_dst = copy_src[:n], copy_dst[:n]
    batched_fill_torch(src_gate_up, src_down, dst_gate_up, dst_down, copy_src, copy_dst)
