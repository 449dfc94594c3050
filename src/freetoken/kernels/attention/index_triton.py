"""The lightning indexer's decode scores in Triton (DSA: DeepSeek-V3.2, GLM-5; DeepSeek-V4's compressed sparse layers):
for sequence b and every key e its page table reaches, ``sum_h w[b, h] * relu(q[b, h] . k_e)`` in float32, each key
read in place through the page table once for all heads (``dsa_reference.index_scores`` and
``v4_compressor.head_scores`` are the torch references), -inf past the keys sequence b may see. The torch path gathers
the keys, widens them to float32 and keeps a [B, Hi, E] float32 product: about five times the keys' bytes moved.

Key e belongs to position ``e m + m - 1`` and sits at row ``page * R + (pos % S) // m`` of the keys tensor (DSA: m = 1,
R = S, a key per token beside its latent; DeepSeek-V4: an entry per m tokens, R entry rows a page). A program whose keys
lie past its sequence's visible count only writes -inf, so a graph captured at a wide page table scores what each
row's own context holds; the top-k over the scores stays in torch, on the device (no host sync).
Shapes: B sequences, Hi heads, Di head dim, P page-table columns, E = P S // m keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys per program


@triton.jit
def _index_scores_kernel(
    Q, W, K, BT, VIS, OUT,
    stride_qb, stride_qh, stride_wb, stride_k, stride_bt, stride_ob, E,
    HI: tl.constexpr, DI: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, RATE: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, F32: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    e0 = tl.program_id(1) * BLOCK_N
    e = e0 + tl.arange(0, BLOCK_N)
    out = OUT + b.to(tl.int64) * stride_ob + e
    tl.store(out, tl.full([BLOCK_N], float("-inf"), tl.float32), mask=e < E)
    vis = tl.load(VIS + b)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hmask, dmask = h < HI, d < DI
    for _ in range(e0, tl.minimum(e0 + BLOCK_N, vis), BLOCK_N):  # once, or never past the visible keys
        q = tl.load(Q + b.to(tl.int64) * stride_qb + h[:, None] * stride_qh + d[None, :],
                    mask=hmask[:, None] & dmask[None, :], other=0.0)  # fmt: skip
        w = tl.load(W + b.to(tl.int64) * stride_wb + h, mask=hmask, other=0.0).to(tl.float32)
        keep = (e < vis) & (e < E)
        pos = e * RATE + RATE - 1
        page = tl.load(BT + b.to(tl.int64) * stride_bt + pos // PAGE, mask=keep, other=0)
        row = page.to(tl.int64) * ROWS + (pos % PAGE) // RATE
        k = tl.load(K + row[:, None] * stride_k + d[None, :], mask=keep[:, None] & dmask[None, :], other=0.0)
        if F32:  # float32 on either side: exact float32 products, as the reference's
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:  # bf16 / fp16 queries and keys: their products are exact in the float32 accumulator
            s = tl.dot(q.to(k.dtype), tl.trans(k))
        tl.store(out, tl.sum(tl.maximum(s, 0.0) * w[:, None], 0), mask=keep)


def index_scores_paged(
    q: torch.Tensor,  # [B, Hi, Di]
    w: torch.Tensor,  # [B, Hi] the head weights (scales folded in)
    keys: torch.Tensor,  # [rows, Di] (a view: its last dim contiguous)
    table: torch.Tensor,  # [B, P] page ids
    visible: torch.Tensor,  # [B] keys each sequence sees (DSA: its length; V4: (p + 1) // m)
    page_size: int,
    rate: int = 1,
    rows_per_page: int | None = None,
) -> torch.Tensor:  # [B, P * S // m] float32
    B, Hi, Di = q.shape
    R = page_size if rows_per_page is None else rows_per_page
    if keys.dim() != 2 or keys.shape[1] != Di or keys.stride(1) != 1 or q.stride(2) != 1:
        raise ValueError(f"indexer scores: queries {tuple(q.shape)} over keys {tuple(keys.shape)} "
                         "(both with a contiguous last dim)")  # fmt: skip
    E = table.shape[1] * page_size // rate
    out = torch.empty((B, E), dtype=torch.float32, device=q.device)
    if B == 0 or E == 0:
        return out
    wf = w.float()
    _index_scores_kernel[(B, triton.cdiv(E, BLOCK_N))](
        q, wf, keys, table, visible, out,
        q.stride(0), q.stride(1), wf.stride(0), keys.stride(0), table.stride(0), out.stride(0), E,
        HI=Hi, DI=Di, BLOCK_H=max(16, triton.next_power_of_2(Hi)), BLOCK_D=max(16, triton.next_power_of_2(Di)),
        PAGE=page_size, RATE=rate, ROWS=R, BLOCK_N=BLOCK_N, F32=torch.float32 in (q.dtype, keys.dtype),
    )  # fmt: skip
    return out
