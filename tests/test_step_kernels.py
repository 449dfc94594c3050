"""The decode step's small fused kernels against their torch references (Triton's interpreter on the CPU, the
kernels on CUDA): q/k norm + rotary + KV write, the router's softmax/top-k, and the one-launch grouping of a
step's routes (the split-KV merge is the decode kernel's own: ``test_paged_attention``)."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.checkpoint.hf_config import RopeConfig
from freetoken.experts.slots.plan import group_routes
from freetoken.kernels.norm import rms_norm_reference
from freetoken.kernels.route import route_reference
from freetoken.layers.rope import Rotary

CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _qkv_reference(
    qkv: torch.Tensor, pos: torch.Tensor, rotary: Rotary, qn: torch.Tensor | None, kn: torch.Tensor | None,
    H: int, hkv: int, hd: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    T = qkv.shape[0]
    q, k, v = qkv.split((H * hd, hkv * hd, hkv * hd), dim=1)
    q, k, v = q.reshape(T, H, hd), k.reshape(T, hkv, hd), v.reshape(T, hkv, hd)
    q = rms_norm_reference(q, qn, 1e-6) if qn is not None else q
    k = rms_norm_reference(k, kn, 1e-6) if kn is not None else k
    return rotary.apply(q, pos), rotary.apply(k, pos), v


def _check_qkv(device: str, dtype: torch.dtype, tol: float) -> None:
    from freetoken.kernels.attention.qkv_rope_triton import qkv_rope_triton

    g = torch.Generator().manual_seed(0)
    for H, hkv, hd, partial, norms in ((4, 2, 16, 1.0, True), (8, 2, 32, 0.5, False), (2, 2, 64, 0.25, True)):
        rope = RopeConfig(10000.0, "default", {"partial_rotary_factor": partial})
        rotary = Rotary(rope, hd, 64, torch.device(device))
        T, slots = 5, 40
        qkv = (torch.randn(T, (H + 2 * hkv) * hd, generator=g) * 2).to(device, dtype)
        pos = torch.tensor([0, 3, 17, 63, 5], device=device)
        slot = torch.tensor([7, 0, 39, 12, 21], device=device)
        qn = (torch.rand(hd, generator=g) + 0.5).to(device, dtype) if norms else None
        kn = (torch.rand(hd, generator=g) + 0.5).to(device, dtype) if norms else None
        kc = torch.zeros(slots, hkv, hd, dtype=dtype, device=device)
        vc = torch.zeros_like(kc)
        q = qkv_rope_triton(qkv, pos, slot, rotary.cos, rotary.sin, qn, kn, kc, vc, H, hkv, hd, 1e-6)
        rq, rk, rv = _qkv_reference(qkv, pos, rotary, qn, kn, H, hkv, hd)
        for got, ref in ((q, rq), (kc[slot], rk)):
            if dtype == torch.float32:
                torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
            else:  # bf16: the norm's statistics may round one ulp apart (the fast-step issue's bf16 rule)
                err, r = (got.float() - ref.float()), ref.float()
                assert err.norm() / r.norm() <= 8e-3 and err.abs().max() <= 2**-6 * r.abs().max()
        assert torch.equal(vc[slot], rv)
        untouched = torch.ones(slots, dtype=torch.bool)
        untouched[slot.cpu()] = False
        assert not kc[untouched.to(device)].any() and not vc[untouched.to(device)].any()


@TRITON_INTERPRETER
def test_qkv_rope_in_the_interpreter() -> None:
    _check_qkv("cpu", torch.float32, 1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 0.0)])  # bf16: see _check_qkv
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qkv_rope_on_cuda(dtype: torch.dtype, tol: float) -> None:
    _check_qkv("cuda", dtype, tol)


def _check_route(device: str, dtype: torch.dtype) -> None:
    from freetoken.kernels.router_triton import route_triton

    g = torch.Generator().manual_seed(2)
    for T, E, k in ((1, 8, 2), (4, 128, 8), (3, 60, 4), (2, 512, 10)):
        for norm in (False, True):
            logits = (torch.randn(T, E, generator=g) * 3).to(device, dtype)
            ids, w = route_triton(logits, k, norm, dtype)
            rids, rw = route_reference(logits, k, norm, dtype)
            tol = 1e-2 if dtype != torch.float32 else 1e-5
            if dtype == torch.float32:  # no ties: the same experts in the same order
                assert torch.equal(ids, rids), (T, E, k, norm)
                torch.testing.assert_close(w, rw, rtol=tol, atol=1e-6)
            else:  # bf16 logits tie: equal logits may come in another order, or swap at the k-th place
                lg = logits.float()
                torch.testing.assert_close(lg.gather(1, ids).sort(1).values, lg.gather(1, rids).sort(1).values)
                torch.testing.assert_close(w.sort(1).values, rw.sort(1).values, rtol=tol, atol=1e-6)
            assert w.dtype == torch.float32 and torch.equal(w, w.to(dtype).float())


def _check_route_linear(device: str, dtype: torch.dtype) -> None:
    """The router's GEMM and routing in one launch against ``F.linear`` + the reference (decode sizes)."""
    from freetoken.kernels.router_triton import route_linear_triton
    from freetoken.kernels.triton_support import tickets

    g = torch.Generator().manual_seed(5)
    for T, E, k, D in ((1, 8, 2, 64), (4, 128, 8, 200), (16, 60, 4, 128), (3, 512, 10, 96), (2, 128, 8, 1000)):
        for norm in (False, True):
            x = torch.randn(T, D, generator=g).to(device, dtype)
            rw = (torch.randn(E, D, generator=g) / D**0.5 * 3).to(device, dtype)
            ids, w = route_linear_triton(x, rw, k, norm)
            logits = torch.nn.functional.linear(x, rw)
            rids, rwt = route_reference(logits, k, norm, dtype)
            assert not tickets(x.device, 1, "route").any()
            if dtype == torch.float32:  # no ties: the same experts in the same order
                assert torch.equal(ids, rids), (T, E, k, norm)
                torch.testing.assert_close(w, rwt, rtol=1e-5, atol=1e-6)
            else:  # the logits may round one ulp apart: equal-valued choices, weights to bf16's precision
                lg = logits.float()
                torch.testing.assert_close(lg.gather(1, ids).sort(1).values, lg.gather(1, rids).sort(1).values,
                                           rtol=2**-7, atol=1e-6)  # fmt: skip
                torch.testing.assert_close(w.sort(1).values, rwt.sort(1).values, rtol=2e-2, atol=1e-6)
            assert w.dtype == torch.float32 and torch.equal(w, w.to(dtype).float())


@TRITON_INTERPRETER
def test_route_linear_in_the_interpreter() -> None:
    _check_route_linear("cpu", torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_route_linear_on_cuda(dtype: torch.dtype) -> None:
    _check_route_linear("cuda", dtype)


@TRITON_INTERPRETER
def test_route_in_the_interpreter() -> None:
    _check_route("cpu", torch.float32)
    _check_route("cpu", torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_route_on_cuda(dtype: torch.dtype) -> None:
    _check_route("cuda", dtype)


def _check_grouping(device: str) -> None:
    from freetoken.experts.slots.plan_triton import group_routes_triton

    g = torch.Generator().manual_seed(3)
    for T, k, E in ((1, 8, 128), (4, 8, 16), (3, 2, 4), (8, 8, 64), (2, 1, 5)):
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(device)
        layer = 2
        got = group_routes_triton(ids, layer * E, 5 * E)
        want = group_routes(ids.reshape(-1) + layer * E, 5 * E)
        for name in ("eids", "order", "route_group", "start", "count", "eid", "valid", "n_groups"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (T, k, E, name)


@TRITON_INTERPRETER
def test_grouping_in_the_interpreter() -> None:
    _check_grouping("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grouping_on_cuda() -> None:
    _check_grouping("cuda")
