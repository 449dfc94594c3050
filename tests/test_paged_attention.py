"""Paged decode attention: the torch reference against a plain per-sequence softmax in float64, and the
Triton split-KV kernel against the float32 reference on the same inputs (Triton's interpreter on the
CPU, the kernel itself on CUDA): lengths across page and block edges, GQA, sliding window, splits."""

from __future__ import annotations

import math

import pytest
import torch

from devices import BF16_MAX, TRITON_INTERPRETER, assert_bf16_close
from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.decode_reference import paged_decode_reference

PAGE = 16


def _case(
    lens: list[int], h: int, hkv: int, hd: int, dtype: torch.dtype, device: str, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DecodeMeta]:
    """Random q and K/V caches; each sequence's pages scattered over the pool in random order."""
    g = torch.Generator().manual_seed(seed)
    pages_each = [math.ceil(n / PAGE) for n in lens]
    num_pages = sum(pages_each) + 3
    order = torch.randperm(num_pages, generator=g).tolist()
    table = torch.zeros((len(lens), max(pages_each) + 1), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages_each):
        table[b, :n] = torch.tensor(order[at : at + n], dtype=torch.int32)
        at += n
    q = torch.randn((len(lens), h, hd), generator=g)
    k = torch.randn((num_pages * PAGE, hkv, hd), generator=g)
    v = torch.randn((num_pages * PAGE, hkv, hd), generator=g)
    meta = DecodeMeta(table.to(device), torch.tensor(lens, dtype=torch.int32, device=device), PAGE)
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), meta


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: DecodeMeta, scale: float, window: int | None):
    out = torch.zeros(q.shape, dtype=torch.float64)
    g = q.shape[1] // k.shape[1]
    for b, n in enumerate(meta.seq_lens.tolist()):
        pos = torch.arange(n)
        slots = meta.block_table[b].long().cpu()[pos // PAGE] * PAGE + pos % PAGE
        if window is not None:
            slots = slots[max(0, n - window) :]
        for h in range(q.shape[1]):
            kk, vv = k[slots, h // g].double().cpu(), v[slots, h // g].double().cpu()
            p = torch.softmax(kk @ q[b, h].double().cpu() * scale, dim=0)
            out[b, h] = p @ vv
    return out


SHAPES = [(4, 4, 64), (8, 2, 64), (32, 4, 128)]
LENS = [[1], [5, 16, 17], [31, 32, 33, 100], [300, 1, 64]]


@pytest.mark.parametrize("h,hkv,hd", SHAPES)
@pytest.mark.parametrize("window", [None, 20])
def test_reference_equals_a_plain_softmax(h: int, hkv: int, hd: int, window: int | None) -> None:
    for lens in LENS:
        q, k, v, meta = _case(lens, h, hkv, hd, torch.float32, "cpu")
        out = paged_decode_reference(q, k, v, meta, hd**-0.5, window)
        torch.testing.assert_close(out.double(), _naive(q, k, v, meta, hd**-0.5, window), atol=1e-5, rtol=1e-5)


def _check_kernel(device: str, dtype: torch.dtype, h: int, hkv: int, hd: int, window: int | None, splits: int):
    from freetoken.kernels.attention.triton_decode import paged_decode_triton

    for lens in LENS:
        q, k, v, meta = _case(lens, h, hkv, hd, dtype, device, seed=len(lens))
        ref = paged_decode_reference(q.float(), k.float(), v.float(), meta, hd**-0.5, window).float()
        out = paged_decode_triton(q, k, v, meta, hd**-0.5, window, splits=splits).float()
        rel = (out - ref).norm() / ref.norm()
        if dtype == torch.float32:  # exact in the interpreter; TF32 products on a GPU
            assert rel < (1e-5 if device == "cpu" else 5e-3), (lens, float(rel))
        else:  # the shared bf16 tolerance against the float32 reference
            assert_bf16_close(out, ref, lens)


@TRITON_INTERPRETER
@pytest.mark.parametrize("h,hkv,hd", SHAPES[:2])
@pytest.mark.parametrize("window,splits", [(None, 1), (None, 3), (20, 2)])
def test_triton_kernel_in_the_interpreter(h: int, hkv: int, hd: int, window: int | None, splits: int) -> None:
    _check_kernel("cpu", torch.float32, h, hkv, hd, window, splits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("h,hkv,hd", [*SHAPES, (16, 8, 256)])
@pytest.mark.parametrize("window,splits", [(None, 1), (None, 8), (None, None), (20, 4), (100, None)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_kernel_on_cuda(h: int, hkv: int, hd: int, window: int | None, splits: int | None, dtype) -> None:
    _check_kernel("cuda", dtype, h, hkv, hd, window, splits or 0)


def _check_tickets(device: str) -> None:
    """The merge in the last split's program: many splits (most of them empty for short rows), several launches on
    one ``DecodeMeta`` (each leaves its tickets at zero for the next), another batch's meta beside it."""
    from freetoken.kernels.attention.triton_decode import paged_decode_triton
    from freetoken.kernels.triton_support import tickets

    for lens, splits in (([1, 40, 3], 32), ([100, 2], 5)):
        q, k, v, meta = _case(lens, 8, 2, 32, torch.float32, device, seed=splits)
        ref = paged_decode_reference(q, k, v, meta, 0.2)
        for _ in range(3):
            out = paged_decode_triton(q, k, v, meta, 0.2, splits=splits)
            assert not tickets(q.device, 1, "paged_decode").any()
            rel = (out - ref).norm() / ref.norm()
            assert rel < (1e-5 if device == "cpu" else 5e-3), (lens, splits, float(rel))
            q = q.flip(0) if len(lens) == 2 else q  # new inputs, same tickets
            ref = paged_decode_reference(q, k, v, meta, 0.2)


@TRITON_INTERPRETER
def test_split_merge_tickets_in_the_interpreter() -> None:
    _check_tickets("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_split_merge_tickets_on_cuda() -> None:
    _check_tickets("cuda")


def _check_rope(device: str, dtype: torch.dtype) -> None:
    """The decode launch that makes q and the new K/V rows from the fused projection (per-head q/k norms, rotary,
    the K/V write) against the torch chain: the norms and rotary, ``index_copy_`` into the pool, the reference."""
    from freetoken.checkpoint.hf_config import RopeConfig
    from freetoken.kernels.attention.triton_decode import paged_decode_rope_triton
    from freetoken.kernels.norm import rms_norm_reference
    from freetoken.layers.rope import Rotary

    g = torch.Generator().manual_seed(3)
    cases = ((8, 2, 32, 1.0, True, None, 3), (4, 4, 64, 0.5, False, 20, 1), (16, 2, 16, 1.0, True, None, 32))
    for h, hkv, hd, partial, norms, window, splits in cases:
        lens = [5, 40, 17]
        q, k, v, meta = _case(lens, h, hkv, hd, dtype, device, seed=hd)
        rope = RopeConfig(10000.0, "default", {"partial_rotary_factor": partial})
        rotary = Rotary(rope, hd, 64, torch.device(device))
        B = len(lens)
        qkv = (torch.randn(B, (h + 2 * hkv) * hd, generator=g) * 2).to(device, dtype)
        pos = torch.tensor(lens, device=device) - 1
        table = meta.block_table.long()
        slots = table[torch.arange(B, device=device), pos // PAGE] * PAGE + pos % PAGE
        qn = (torch.rand(hd, generator=g) + 0.5).to(device, dtype) if norms else None
        kn = (torch.rand(hd, generator=g) + 0.5).to(device, dtype) if norms else None
        qh, kh, vh = qkv.split((h * hd, hkv * hd, hkv * hd), dim=1)
        qh, kh, vh = qh.reshape(B, h, hd), kh.reshape(B, hkv, hd), vh.reshape(B, hkv, hd)
        qh = rotary.apply(rms_norm_reference(qh, qn, 1e-6) if qn is not None else qh, pos)
        kh = rotary.apply(rms_norm_reference(kh, kn, 1e-6) if kn is not None else kh, pos)
        k_ref, v_ref = k.clone().index_copy_(0, slots, kh), v.clone().index_copy_(0, slots, vh)
        ref = paged_decode_reference(qh.float(), k_ref.float(), v_ref.float(), meta, hd**-0.5, window)
        if splits == 1:  # the step graph's int64 page table and lengths, read in place
            meta = DecodeMeta(meta.block_table.long(), meta.seq_lens.long(), PAGE)
        out = paged_decode_rope_triton(qkv, pos, slots, rotary.cos, rotary.sin, qn, kn, 1e-6, k, v, meta, h, hd,
                                       hd**-0.5, window, splits)  # fmt: skip
        assert out.dtype == dtype and out.shape == (B, h, hd)
        assert torch.equal(v, v_ref)  # the V rows copied, nothing else touched
        if dtype == torch.float32:
            torch.testing.assert_close(k, k_ref, rtol=1e-5, atol=1e-5)
            rel = (out.float() - ref).norm() / ref.norm()
            assert rel < (1e-5 if device == "cpu" else 5e-3), (h, hkv, hd, float(rel))
        else:  # bf16: the norm's statistics may round one ulp apart (the fast-step issue's bf16 rule)
            err = (k.float() - k_ref.float()).abs().max()
            assert err <= BF16_MAX * k_ref.float().abs().max(), float(err)
            assert_bf16_close(out, ref, (h, hkv, hd))


@TRITON_INTERPRETER
def test_rope_decode_in_the_interpreter() -> None:
    _check_rope("cpu", torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_decode_on_cuda(dtype: torch.dtype) -> None:
    _check_rope("cuda", dtype)


def test_dispatch_picks_the_reference_on_a_cpu() -> None:
    from freetoken.kernels.attention.registry import select

    backend = select(torch.device("cpu"))
    assert backend.name == "cpu"
    q, k, v, meta = _case([7, 40], 8, 2, 64, torch.float32, "cpu")
    torch.testing.assert_close(
        backend.decode(q, k, v, meta, 0.125), paged_decode_reference(q, k, v, meta, 0.125), atol=0, rtol=0
    )
