"""Triton kernel: copy whole expert rows of both banks from the (mapped host) pool into slots.

Grid (Kv, chunks): program (j, c) copies chunk c of entry j's gate_up row followed by its down row,
treated as one row of GU + DN elements. Entries j >= count return at once, so padded copies cost
nothing. Pool rows are read through UVA from pinned host memory: wide, coalesced loads keep many
PCIe reads in flight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096  # elements per load
_ITERS = 8  # loads per program


@triton.jit
def _gather_rows_kernel(
    src_gu, src_dn, dst_gu, dst_dn, copy_src, copy_dst, count_ptr,
    GU: tl.constexpr, DN: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
):  # fmt: skip
    j = tl.program_id(0)
    c = tl.program_id(1)
    base = c.to(tl.int64) * (BLOCK * ITERS)
    count = tl.load(count_ptr)
    if j < count:
        src = tl.load(copy_src + j).to(tl.int64)
        dst = tl.load(copy_dst + j).to(tl.int64)
        for it in range(ITERS):
            offs = base + it * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
            in_gu = offs < GU
            v = tl.load(src_gu + src * GU + offs, mask=in_gu)
            tl.store(dst_gu + dst * GU + offs, v, mask=in_gu)
            o2 = offs - GU
            in_dn = (offs >= GU) & (o2 < DN)
            w = tl.load(src_dn + src * DN + o2, mask=in_dn)
            tl.store(dst_dn + dst * DN + o2, w, mask=in_dn)


def gather_rows_triton(
    src_gate_up: torch.Tensor,  # [N, 2I, D] mapped pool view (or any device tensor)
    src_down: torch.Tensor,  # [N, D, I]
    dst_gate_up: torch.Tensor,  # [S+1, 2I, D]
    dst_down: torch.Tensor,  # [S+1, D, I]
    copy_src: torch.Tensor,  # [Kv] int64
    copy_dst: torch.Tensor,  # [Kv] int64
    count: torch.Tensor,  # [] int64
    block: int = _BLOCK,
    iters: int = _ITERS,
    warps: int = 4,
) -> None:
    """Program (j, c) copies elements [c * block * iters, (c + 1) * block * iters) of entry j's row
    (``bench/gpu/gather_bw.py`` compares settings)."""
    kv = copy_src.numel()
    if kv == 0:
        return
    gu = src_gate_up[0].numel()
    dn = src_down[0].numel()
    chunks = triton.cdiv(gu + dn, block * iters)
    _gather_rows_kernel[(kv, chunks)](
        src_gate_up, src_down, dst_gate_up, dst_down, copy_src, copy_dst, count,
        GU=gu, DN=dn, BLOCK=block, ITERS=iters, num_warps=warps,
    )  # fmt: skip

