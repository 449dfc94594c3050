"""Triton: the streamed CPU branch's staging kernel, writing its inputs into mapped pinned host buffers in one
launch (``streamed.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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

