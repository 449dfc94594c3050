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
    part_eid, part_rows, n_rows, scratch, KVN,
    GU: tl.constexpr, DN: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
    INTER: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    j = tl.program_id(0)
    c = tl.program_id(1)
    base = c.to(tl.int64) * (BLOCK * ITERS)
    if j == KVN:  # the shared expert's rows [0, rows) into the scratch slot, zeros elsewhere
        rows = tl.load(part_rows)
        if rows > 0:
            eid = tl.minimum(tl.load(part_eid), n_rows - 1).to(tl.int64)
            dst = scratch.to(tl.int64)
            for it in range(ITERS):
                offs = base + it * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
                in_gu = offs < GU
                keep_gu = in_gu & (((offs // D) % INTER) < rows)  # gate rows [0, rows), up [I, I + rows)
                v = tl.load(src_gu + eid * GU + offs, mask=keep_gu, other=0.0)
                tl.store(dst_gu + dst * GU + offs, v, mask=in_gu)
                o2 = offs - GU
                in_dn = (offs >= GU) & (o2 < DN)
                keep_dn = in_dn & ((o2 % INTER) < rows)  # down columns [0, rows)
                w = tl.load(src_dn + eid * DN + o2, mask=keep_dn, other=0.0)
                tl.store(dst_dn + dst * DN + o2, w, mask=in_dn)
    else:
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
    partial: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([] eid, [] rows): into the scratch slot S
) -> None:
    """Program (j, c) copies elements [c * block * iters, (c + 1) * block * iters) of entry j's row
    (``bench/gpu/gather_bw.py`` compares settings: on the H200 box all read 37-46 GB/s). With ``partial``
    one more row of programs copies a shared expert's GPU rows (``slot_copy.partial_fill_torch``'s contract), so a
    layer's fills stay one launch."""
    kv = copy_src.numel()
    if kv == 0 and partial is None:
        return
    gu = src_gate_up[0].numel()
    dn = src_down[0].numel()
    inter, d = src_down.shape[2], src_down.shape[1]
    chunks = triton.cdiv(gu + dn, block * iters)
    p_eid, p_rows = partial if partial is not None else (count, count)  # unread without a partial row
    kvn = kv if partial is not None else -1  # the program row of the partial copy (-1: none)
    _gather_rows_kernel[(kv + (partial is not None), chunks)](
        src_gate_up, src_down, dst_gate_up, dst_down, copy_src, copy_dst, count,
        p_eid, p_rows, src_gate_up.shape[0], dst_gate_up.shape[0] - 1, kvn,
        GU=gu, DN=dn, BLOCK=block, ITERS=iters, INTER=inter, D=d, num_warps=warps,
    )  # fmt: skip


@triton.jit
def _stage_kernel(x, codes, w, x_dst, codes_dst, w_dst, NX, NK, BLOCK: tl.constexpr):
    """x (any float dtype) -> float32, codes int64 and w -> float32, into mapped host buffers."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mx = offs < NX
    tl.store(x_dst + offs, tl.load(x + offs, mask=mx).to(tl.float32), mask=mx)
    mk = offs < NK
    tl.store(codes_dst + offs, tl.load(codes + offs, mask=mk), mask=mk)
    tl.store(w_dst + offs, tl.load(w + offs, mask=mk).to(tl.float32), mask=mk)


def stage_inputs_triton(
    x: torch.Tensor,  # [T, D] contiguous, on the GPU
    codes: torch.Tensor,  # [T*k] int64
    w: torch.Tensor,  # [T*k] float
    x_dst: torch.Tensor,  # [T, D] float32 (e.g. a mapped view of pinned host memory)
    codes_dst: torch.Tensor,  # [T*k] int64
    w_dst: torch.Tensor,  # [T*k] float32
) -> None:
    """One launch writing the CPU branch's three inputs (the stream-ordered branch's zero-copy hand-off)."""
    nx, nk = x.numel(), codes.numel()
    block = 1024
    _stage_kernel[(triton.cdiv(max(nx, nk), block),)](x, codes, w, x_dst, codes_dst, w_dst, nx, nk, BLOCK=block)


@triton.jit
def _stage_list_kernel(count, src, dst, out, KV, BLOCK: tl.constexpr):
    """out = [count, src[KV], dst[KV]] (int64), e.g. into a mapped host buffer."""
    i = tl.arange(0, BLOCK)
    m = i < KV
    tl.store(out + 1 + i, tl.load(src + i, mask=m), mask=m)
    tl.store(out + 1 + KV + i, tl.load(dst + i, mask=m), mask=m)
    tl.store(out, tl.load(count))


def stage_fill_list_triton(count: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, out: torch.Tensor) -> None:
    """One launch writing a round's fill list ``[count, src[kv], dst[kv]]`` into ``out`` [1 + 2 kv] int64 (the
    copy-engine fills' hand-off through mapped host memory)."""
    kv = src.numel()
    _stage_list_kernel[(1,)](count, src, dst, out, kv, BLOCK=max(16, triton.next_power_of_2(max(kv, 1))))
