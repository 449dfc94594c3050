"""Attention sinks (gpt-oss: a learned logit per head in every softmax's denominator, carrying no value): the torch
references of paged decode and prefill against a plain float64 softmax with the sink column, with and without a
sliding window, GQA; the Triton kernels (decode: one split and several, merged; prefill) against the references in
Triton's interpreter; the split merge's torch form; the CPU backend's fused decode declines sinks (no C++ form)."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.kernels.attention.decode_reference import paged_decode_reference
from freetoken.kernels.attention.prefill_reference import paged_prefill_reference
from test_paged_attention import _case as decode_case
from test_prefill_attention import CASES as PREFILL_CASES
from test_prefill_attention import _case as prefill_case

PAGE = 16
SCALE = 0.25


def _sinks(h: int) -> torch.Tensor:
    return torch.linspace(-1.0, 3.0, h)  # from small to dominant


def _plain(scores: torch.Tensor, values: torch.Tensor, sink: float) -> torch.Tensor:
    """softmax([scores, sink])[:-1] @ values in float64."""
    p = torch.softmax(torch.cat((scores.double(), torch.tensor([sink], dtype=torch.float64))), dim=0)[:-1]
    return p @ values.double()


def _naive_decode(q, k, v, meta, window, sinks) -> torch.Tensor:
    out = torch.zeros(q.shape, dtype=torch.float64)
    g = q.shape[1] // k.shape[1]
    for b, n in enumerate(meta.seq_lens.tolist()):
        pos = torch.arange(n)
        slots = meta.block_table[b].long()[pos // PAGE] * PAGE + pos % PAGE
        if window is not None:
            slots = slots[max(0, n - window) :]
        for h in range(q.shape[1]):
            kk, vv = k[slots, h // g], v[slots, h // g]
            out[b, h] = _plain(kk.double() @ q[b, h].double() * SCALE, vv, float(sinks[h]))
    return out


def _naive_prefill(q, k, v, meta, window, sinks) -> torch.Tensor:
    out = torch.zeros(q.shape, dtype=torch.float64)
    g = q.shape[1] // k.shape[1]
    for s in range(meta.q_start.shape[0]):
        qs, ql, ctx = int(meta.q_start[s]), int(meta.q_len[s]), int(meta.ctx_len[s])
        pos = torch.arange(ctx)
        slots = meta.block_table[s].long()[pos // PAGE] * PAGE + pos % PAGE
        for i in range(ql):
            p = ctx - ql + i
            keep = (pos <= p) & ((pos > p - window) if window else torch.ones_like(pos, dtype=torch.bool))
            for h in range(q.shape[1]):
                kk, vv = k[slots[keep], h // g], v[slots[keep], h // g]
                out[qs + i, h] = _plain(kk.double() @ q[qs + i, h].double() * SCALE, vv, float(sinks[h]))
    return out


DECODE_LENS = [[1], [5, 16, 17], [31, 32, 33, 100]]


def test_decode_reference_with_sinks() -> None:
    for window in (None, 20):
        for lens in DECODE_LENS:
            q, k, v, meta = decode_case(lens, 8, 2, 32, torch.float32, "cpu")
            sinks = _sinks(8)
            out = paged_decode_reference(q, k, v, meta, SCALE, window, sinks)
            torch.testing.assert_close(out.double(), _naive_decode(q, k, v, meta, window, sinks), atol=1e-5, rtol=1e-5)
            # the sinks only ever take weight away: without them the output differs
            assert not torch.allclose(out, paged_decode_reference(q, k, v, meta, SCALE, window), atol=1e-3)


def test_prefill_reference_with_sinks() -> None:
    for window in (None, 24):
        for seqs in PREFILL_CASES:
            q, k, v, meta = prefill_case(seqs, 4, 2, 16, torch.float32, "cpu")
            sinks = _sinks(4)
            out = paged_prefill_reference(q, k, v, meta, SCALE, window, sinks)
            ref = _naive_prefill(q, k, v, meta, window, sinks)
            torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_split_merge_with_sinks() -> None:
    """Splitting a context and merging the splits' partial sums with the sink in the denominator equals one pass."""
    pytest.importorskip("triton")
    from freetoken.kernels.attention.triton_decode import merge_splits

    g = torch.Generator().manual_seed(3)
    s = torch.randn((1, 2, 12), generator=g)
    v = torch.randn((1, 2, 12, 8), generator=g)
    sinks = torch.tensor([0.5, 2.0])
    parts = [(s[..., i : i + 4], v[..., i : i + 4, :]) for i in (0, 4, 8)]
    mx = torch.stack([p[0].max(-1).values for p in parts], dim=-1)  # [1, 2, 3]
    sm = torch.stack([(p[0] - m[..., None]).exp().sum(-1) for p, m in zip(parts, mx.unbind(-1))], dim=-1)
    acc = torch.stack([((p[0] - m[..., None]).exp()[..., None] * p[1]).sum(-2) for p, m in zip(parts, mx.unbind(-1))],
                      dim=2)  # fmt: skip
    merged = merge_splits(acc, mx, sm, sinks)
    for h in range(2):
        torch.testing.assert_close(merged[0, h].double(), _plain(s[0, h], v[0, h], float(sinks[h])), atol=1e-6,
                                   rtol=1e-6)  # fmt: skip


def test_cpu_fused_decode_declines_sinks() -> None:
    from freetoken.kernels.attention.cpu_backend import CpuAttention

    q, k, v, meta = decode_case([5], 4, 2, 16, torch.float32, "cpu")
    qkv = torch.zeros((1, (4 + 2 * 2) * 16))
    assert CpuAttention().decode_fused(qkv, None, (k, v), meta, SCALE, None, False, _sinks(4)) is None  # type: ignore[arg-type]


@TRITON_INTERPRETER
def test_triton_decode_with_sinks_in_the_interpreter() -> None:
    from freetoken.kernels.attention.triton_decode import paged_decode_triton

    for window, splits in ((None, 1), (None, 3), (20, 2)):
        for lens in DECODE_LENS:
            q, k, v, meta = decode_case(lens, 8, 2, 32, torch.float32, "cpu", seed=len(lens))
            sinks = _sinks(8)
            ref = paged_decode_reference(q, k, v, meta, SCALE, window, sinks)
            out = paged_decode_triton(q, k, v, meta, SCALE, window, splits=splits, sinks=sinks)
            assert float((out - ref).norm() / ref.norm()) < 1e-5, (lens, window, splits)


@TRITON_INTERPRETER
def test_triton_prefill_with_sinks_in_the_interpreter() -> None:
    from freetoken.kernels.attention.triton_prefill import paged_prefill_triton

    for window in (None, 24):
        for seqs in PREFILL_CASES:
            q, k, v, meta = prefill_case(seqs, 4, 2, 16, torch.float32, "cpu")
            sinks = _sinks(4)
            ref = paged_prefill_reference(q, k, v, meta, SCALE, window, sinks)
            out = paged_prefill_triton(q, k, v, meta, SCALE, window, sinks)
            assert float((out - ref).norm() / ref.norm()) < 1e-5, (seqs, window)


@TRITON_INTERPRETER
@pytest.mark.parametrize("sinks", [False, True])
def test_ring_window_decode_through_the_paged_kernel(sinks: bool) -> None:
    """gpt-oss's window layers on CUDA: ``ring_decode_triton`` (the token's K/V into its ring row first, then the ring
    read as one page through the paged decode kernel) against the layer's torch path, in Triton's interpreter:
    positions before, at and past the window (the ring not yet full, just full, wrapped), GQA; the rings after."""
    from types import SimpleNamespace

    from freetoken.layers.window_attention import WindowAttention, ring_decode_triton

    g = torch.Generator().manual_seed(5)
    S, W, H, hkv, hd = 5, 32, 8, 2, 16
    layer = WindowAttention.__new__(WindowAttention)
    layer.window, layer.h, layer.hkv, layer.hd, layer.scale = W, H, hkv, hd, hd**-0.5
    layer.sinks = _sinks(H) if sinks else None
    rk, rv = (torch.randn(S, W, hkv, hd, generator=g) for _ in range(2))
    slots = torch.tensor([3, 0, 4, 1])
    pos = torch.tensor([5, W - 1, W, 3 * W + 7])
    q = torch.randn(4, H, hd, generator=g)
    k, v = (torch.randn(4, hkv, hd, generator=g) for _ in range(2))
    batch = SimpleNamespace(state_slots=slots, positions=pos)
    rk_ref, rv_ref = rk.clone(), rv.clone()
    want = layer._decode(q, k, v, batch, rk_ref, rv_ref)  # type: ignore[arg-type]  # the torch path on the CPU
    got = ring_decode_triton(q, k, v, slots, pos, rk, rv, layer.scale, layer.sinks)
    assert float((got - want).norm() / want.norm()) < 1e-5
    assert torch.equal(rk, rk_ref) and torch.equal(rv, rv_ref)
