"""One batched copy of a round's fills, every bank: pool rows -> slots, indexed by device tensors.

Banks are opaque here (an expert's packed weights and scales are rows like any other). ``copy_src``/``copy_dst``
are [Kv] with a valid prefix of ``count`` entries; the rest point at the scratch slot. CPU: ``index_copy_`` of the
valid prefix from the pool (reading ``count`` is free there). CUDA: a Triton kernel gathers the rows straight from
the pinned, mapped host pool (UVA) and skips the padded entries by reading ``count`` on the device; without Triton
the same gather runs as torch ops on the mapped view (padded rows are copied too: the host cannot read ``count``
without a sync).
"""

from __future__ import annotations

import torch

from freetoken.experts.base import raw
from freetoken.kernels.triton_support import use_triton


def batched_fill_torch(
    src: tuple[torch.Tensor, ...],  # every bank [N, ...] of the pool (or its mapped device views)
    dst: tuple[torch.Tensor, ...],  # the same banks' slots [S+1, ...]
    copy_src: torch.Tensor,  # [Kv] int64 pool rows
    copy_dst: torch.Tensor,  # [Kv] int64 slots (padded entries: scratch slot S)
) -> None:
    """Reference: gather + scatter of whole rows (padded entries rewrite the scratch slot)."""
    if copy_src.numel() == 0:
        return
    src_idx = copy_src.to(src[0].device)
    for s, d in zip(src, dst):
        raw(d).index_copy_(0, copy_dst, raw(s).index_select(0, src_idx).to(d.device))


def batched_fill(
    src: tuple[torch.Tensor, ...],
    dst: tuple[torch.Tensor, ...],
    copy_src: torch.Tensor,
    copy_dst: torch.Tensor,
    count: torch.Tensor,  # [] int64 valid entries
) -> None:
    """The round's fills: on CUDA with Triton one gather launch for every bank."""
    if use_triton(dst[0]):
        from freetoken.experts.slots.copy_triton import gather_rows_triton

        gather_rows_triton(src, dst, copy_src, copy_dst, count)
        return
    if dst[0].device.type == "cpu":  # reading the count costs nothing here: skip the padded entries
        n = int(count)
        copy_src, copy_dst = copy_src[:n], copy_dst[:n]
    batched_fill_torch(src, dst, copy_src, copy_dst)


def copy_runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(src row, dst slot) pairs -> maximal runs (src, dst, n) where both advance by one: one copy each."""
    runs: list[tuple[int, int, int]] = []
    for src, dst in pairs:
        if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
            s, d, n = runs[-1]
            runs[-1] = (s, d, n + 1)
        else:
            runs.append((src, dst, 1))
    return runs


def copy_rows(
    src: tuple[torch.Tensor, ...],  # every bank [N, ...] of the pool (host; pinned rows copy by DMA)
    dst: tuple[torch.Tensor, ...],  # the same banks' slots [S+1, ...]
    runs: list[tuple[int, int, int]],  # (src row, dst slot, n) from ``copy_runs``
) -> None:
    """Whole runs of rows, every bank, on the current stream (CUDA: asynchronous DMA from the pinned pool;
    later kernels on the stream see the rows)."""
    for s, d, n in runs:
        for pool_bank, bank in zip(src, dst):  # every bank: weights and scales alike
            raw(bank)[d : d + n].copy_(raw(pool_bank)[s : s + n], non_blocking=True)
