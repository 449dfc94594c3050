"""One batched copy of a round's fills, all banks: pool rows -> slots, indexed by device tensors.

``copy_src``/``copy_dst`` are [Kv] with a valid prefix of ``count`` entries; the rest point at the
scratch slot. CPU: ``index_copy_`` of the valid prefix from the pool (reading ``count`` is free there).
CUDA: a Triton kernel gathers the rows straight from the pinned, mapped host pool (UVA) and skips the
padded entries by reading ``count`` on the device; without Triton the same gather runs as torch ops on
the mapped view (padded rows are copied too: the host cannot read ``count`` without a sync).
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


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


def partial_fill_torch(
    src_gate_up: torch.Tensor,  # [N, 2I, D] pool (or its mapped device view)
    src_down: torch.Tensor,  # [N, D, I]
    dst_gate_up: torch.Tensor,  # [2I, D] one slot
    dst_down: torch.Tensor,  # [D, I]
    eid: torch.Tensor,  # [] int64 pool row (N: none; the slot is zeroed)
    rows: torch.Tensor,  # [] int64 intermediate rows to copy: [0, rows) of gate, of up, of down's columns
) -> None:
    """Reference: the slot gets the expert's first ``rows`` intermediate rows, zeros elsewhere. Reads the
    whole expert (device-side eid and rows, no sync); the Triton kernel reads only the kept part."""
    n_rows, inter = src_gate_up.shape[0], src_down.shape[2]
    idx = eid.clamp(max=n_rows - 1).reshape(1).to(src_gate_up.device)
    keep_i = (torch.arange(inter, device=dst_down.device) < rows.to(dst_down.device)) & (eid < n_rows).to(
        dst_down.device
    )
    gu = src_gate_up.index_select(0, idx)[0].to(dst_gate_up.device)
    dn = src_down.index_select(0, idx)[0].to(dst_down.device)
    dst_gate_up.copy_(torch.where(keep_i.repeat(2)[:, None], gu, torch.zeros_like(gu)))
    dst_down.copy_(torch.where(keep_i[None, :], dn, torch.zeros_like(dn)))


def partial_fill(
    src_gate_up: torch.Tensor,
    src_down: torch.Tensor,
    dst_gate_up: torch.Tensor,
    dst_down: torch.Tensor,
    eid: torch.Tensor,
    rows: torch.Tensor,
) -> None:
    """``partial_fill_torch``'s contract; the CPU device copies the kept slices (reading eid and rows costs
    nothing there). CUDA with Triton copies it inside ``batched_fill``'s one launch instead."""
    if dst_gate_up.device.type == "cpu":
        e, c = int(eid), int(rows)
        inter = src_down.shape[2]
        dst_gate_up.zero_()
        dst_down.zero_()
        if e < src_gate_up.shape[0] and c > 0:
            dst_gate_up[:c] = src_gate_up[e, :c]
            dst_gate_up[inter : inter + c] = src_gate_up[e, inter : inter + c]
            dst_down[:, :c] = src_down[e, :, :c]
        return
    partial_fill_torch(src_gate_up, src_down, dst_gate_up, dst_down, eid, rows)


def batched_fill(
    src_gate_up: torch.Tensor,
    src_down: torch.Tensor,
    dst_gate_up: torch.Tensor,
    dst_down: torch.Tensor,
    copy_src: torch.Tensor,
    copy_dst: torch.Tensor,
    count: torch.Tensor,  # [] int64 valid entries
    partial: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([] eid, [] rows): ``partial_fill`` of slot S
) -> None:
    """The round's fills, then (with ``partial``) a shared expert's GPU rows into the scratch slot; on CUDA
    with Triton both in one launch."""
    if dst_gate_up.device.type == "cuda" and triton_available():
        from freetoken.experts.triton_copy import gather_rows_triton

        gather_rows_triton(src_gate_up, src_down, dst_gate_up, dst_down, copy_src, copy_dst, count, partial=partial)
        return
    if dst_gate_up.device.type == "cpu":  # reading the count costs nothing here: skip the padded entries
        n = int(count)
        copy_src, copy_dst = copy_src[:n], copy_dst[:n]
    batched_fill_torch(src_gate_up, src_down, dst_gate_up, dst_down, copy_src, copy_dst)
    if partial is not None:  # after the fills: their padded entries may rewrite the scratch slot
        S = dst_gate_up.shape[0] - 1
        partial_fill(src_gate_up, src_down, dst_gate_up[S], dst_down[S], *partial)
