"""Causal varlen prefill attention, the Triton kernel and the torch reference, against a per-sequence float64
softmax: several sequences of different lengths in one step, chunks that start after an earlier chunk's
context, GQA, sliding window (the kernel in Triton's interpreter on the CPU and on CUDA; the reference on the
CPU, in blocks of query rows small enough that every case spans several)."""

from __future__ import annotations

import math

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.kernels.attention import PrefillMeta

PAGE = 16


def _case(seqs: list[tuple[int, int]], h: int, hkv: int, hd: int, dtype: torch.dtype, device: str):
    """seqs: (new tokens, context length after the step) per sequence."""
    g = torch.Generator().manual_seed(sum(a * 7 + b for a, b in seqs))
    pages = [math.ceil(c / PAGE) for _, c in seqs]
    order = torch.randperm(sum(pages) + 2, generator=g).tolist()
    table = torch.zeros((len(seqs), max(pages)), dtype=torch.int32)
    at = 0
    for s, n in enumerate(pages):
        table[s, :n] = torch.tensor(order[at : at + n])
        at += n
    T = sum(q for q, _ in seqs)
    q = torch.randn((T, h, hd), generator=g)
    k = torch.randn(((sum(pages) + 2) * PAGE, hkv, hd), generator=g)
    v = torch.randn(((sum(pages) + 2) * PAGE, hkv, hd), generator=g)
    starts = torch.tensor([0] + [q for q, _ in seqs][:-1]).cumsum(0).to(torch.int32)
    meta = PrefillMeta(
        starts.to(device), torch.tensor([q for q, _ in seqs], dtype=torch.int32, device=device),
        torch.tensor([c for _, c in seqs], dtype=torch.int32, device=device), table.to(device), PAGE,
        max(q for q, _ in seqs),
    )  # fmt: skip
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), meta


def _naive(q, k, v, meta: PrefillMeta, scale: float, window: int | None) -> torch.Tensor:
    out = torch.zeros(q.shape, dtype=torch.float64)
    g = q.shape[1] // k.shape[1]
    for s in range(meta.q_start.shape[0]):
        qs, ql, ctx = int(meta.q_start[s]), int(meta.q_len[s]), int(meta.ctx_len[s])
        pos = torch.arange(ctx)
        slots = meta.block_table[s].long().cpu()[pos // PAGE] * PAGE + pos % PAGE
        for i in range(ql):
            p = ctx - ql + i
            keep = (pos <= p) & ((pos > p - window) if window else torch.ones_like(pos, dtype=torch.bool))
            for hh in range(q.shape[1]):
                kk, vv = k[slots[keep], hh // g].double().cpu(), v[slots[keep], hh // g].double().cpu()
                out[qs + i, hh] = torch.softmax(kk @ q[qs + i, hh].double().cpu() * scale, 0) @ vv
    return out


CASES = [[(5, 5)], [(40, 40), (3, 70), (17, 17)], [(33, 100)]]


def _check(
    device: str, dtype: torch.dtype, h: int, hkv: int, hd: int, window: int | None, tol: float, fn=None
) -> None:
    """rel L2 <= tol; for bf16 also the worst element <= 2^-6 max|ref| (the decode kernel's tolerance)."""
    if fn is None:
        from freetoken.kernels.attention.triton_prefill import paged_prefill_triton as fn
    for seqs in CASES:
        q, k, v, meta = _case(seqs, h, hkv, hd, dtype, device)
        out = fn(q, k, v, meta, hd**-0.5, window).double().cpu()
        ref = _naive(q.float(), k.float(), v.float(), meta, hd**-0.5, window)
        rel = (out - ref).norm() / ref.norm()
        worst = (out - ref).abs().max() / ref.abs().max()
        assert rel < tol, (seqs, float(rel))
        if dtype != torch.float32:
            assert worst <= 2**-6, (seqs, float(worst))


@pytest.mark.parametrize("h,hkv,hd,window", [(4, 2, 16, None), (2, 2, 32, 24)])
def test_prefill_reference_in_row_blocks(monkeypatch, h: int, hkv: int, hd: int, window: int | None) -> None:
    from freetoken.kernels.attention import prefill_reference as pr

    monkeypatch.setattr(pr, "SCORE_ELEMENTS", 1)  # blocks of MIN_ROWS rows: every case but the first spans several
    assert pr.rows_per_block(h, 100) == pr.MIN_ROWS
    # without a window the CPU takes the flash kernel: route it to the row blocks here, so they are tested too
    monkeypatch.setattr(pr, "causal_flash_cpu", lambda q, k, v, scale: pr.causal_in_row_blocks(q, k, v, scale, None))
    _check("cpu", torch.float32, h, hkv, hd, window, 1e-6, pr.paged_prefill_reference)


@pytest.mark.parametrize("h,hkv,hd", [(4, 2, 16), (2, 2, 32), (8, 1, 64)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 8e-3)])
def test_prefill_reference_flash_on_cpu(h: int, hkv: int, hd: int, dtype: torch.dtype, tol: float) -> None:
    """No window on a CPU: the flash kernel over the context before the new tokens and over themselves, merged
    (the cases' chunks that start after an earlier context exercise the merge)."""
    from freetoken.kernels.attention import prefill_reference as pr

    _check("cpu", dtype, h, hkv, hd, None, tol, pr.paged_prefill_reference)


@TRITON_INTERPRETER
@pytest.mark.parametrize("h,hkv,hd,window", [(4, 2, 16, None), (2, 2, 32, 24)])
def test_prefill_kernel_in_the_interpreter(h: int, hkv: int, hd: int, window: int | None) -> None:
    _check("cpu", torch.float32, h, hkv, hd, window, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("h,hkv,hd,window", [(32, 4, 128, None), (8, 8, 64, 24), (16, 8, 256, None)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 8e-3)])
def test_prefill_kernel_on_cuda(h: int, hkv: int, hd: int, window: int | None, dtype: torch.dtype, tol: float) -> None:
    _check("cuda", dtype, h, hkv, hd, window, tol)
