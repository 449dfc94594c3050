"""Triton kernel: copy whole expert rows of every bank from the (mapped host) pool into slots.

Grid (Kv, chunks): program (j, c) copies chunk c of entry j's row, the row being the concatenation of the banks'
rows (gate_up, down, then up to two scale banks: GU + DN + GS + DS elements). Entries j >= count return at once,
so padded copies cost nothing. Pool rows are read through UVA from pinned host memory: wide, coalesced loads keep
many PCIe reads in flight. Banks of one dtype are copied in it (bf16 pools); a packed pool's banks (fp8 weights,
float32 scales) are copied as int32 words, so no fp8 type ever reaches Triton (sm_86 has none).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096  # elements per load
_ITERS = 8  # loads per program


@triton.jit
def _segment(src, dst, s_row, d_row, offs, lo, n: tl.constexpr):
    o = offs - lo
    m = (offs >= lo) & (o < n)
    v = tl.load(src + s_row * n + o, mask=m)
    tl.store(dst + d_row * n + o, v, mask=m)


@triton.jit
def _gather_rows_kernel(
    src_gu, src_dn, src_gs, src_ds, dst_gu, dst_dn, dst_gs, dst_ds, copy_src, copy_dst, count_ptr,
    GU: tl.constexpr, DN: tl.constexpr, GS: tl.constexpr, DS: tl.constexpr, BLOCK: tl.constexpr,
    ITERS: tl.constexpr,
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
            _segment(src_gu, dst_gu, src, dst, offs, 0, GU)
            _segment(src_dn, dst_dn, src, dst, offs, GU, DN)
            if GS > 0:
                _segment(src_gs, dst_gs, src, dst, offs, GU + DN, GS)
            if DS > 0:
                _segment(src_ds, dst_ds, src, dst, offs, GU + DN + GS, DS)


def as_words(banks: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The banks as the kernel copies them: as they are when they share a dtype of 2+ bytes, else int32 words."""
    if len({t.dtype for t in banks}) == 1 and banks[0].element_size() >= 2:
        return banks
    for t in banks:
        assert (t[0].numel() * t.element_size()) % 4 == 0, "bank rows must be whole int32 words"
    # rows flattened first: a row's bytes are whole words where its last dimension is not (FP4 scale rows)
    return tuple(t.view(torch.uint8).reshape(t.shape[0], -1).view(torch.int32) for t in banks)


def gather_rows_triton(
    src: tuple[torch.Tensor, ...],  # every bank [N, ...]: mapped pool views (or any device tensors)
    dst: tuple[torch.Tensor, ...],  # the slots of the same banks [S+1, ...]
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
    if not 2 <= len(src) <= 4 or len(src) != len(dst):
        raise ValueError(f"2 to 4 banks, as many sources as slots; got {len(src)} and {len(dst)}")
    s, d = as_words(tuple(src)), as_words(tuple(dst))
    sizes = [t[0].numel() for t in s] + [0] * (4 - len(s))
    s = s + (s[0],) * (4 - len(s))  # unused banks: size 0, never touched
    d = d + (d[0],) * (4 - len(d))
    chunks = triton.cdiv(sum(sizes), block * iters)
    _gather_rows_kernel[(kv, chunks)](
        *s, *d, copy_src, copy_dst, count,
        GU=sizes[0], DN=sizes[1], GS=sizes[2], DS=sizes[3], BLOCK=block, ITERS=iters, num_warps=warps,
    )  # fmt: skip
