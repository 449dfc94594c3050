"""RMSNorm and residual add + RMSNorm: the Triton kernel against the torch reference (Triton's interpreter
on the CPU, the kernel on CUDA), rows of hidden size and of one head."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.kernels.norm import add_rms_norm, rms_norm_reference


def _case(rows: int, n: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * n)
    x, d = torch.randn(rows, n, generator=g) * 3, torch.randn(rows, n, generator=g)
    w = torch.rand(n, generator=g) + 0.5
    return x.to(device, dtype), d.to(device, dtype), w.to(device, dtype)


def _check(device: str, dtype: torch.dtype, tol: float) -> None:
    from freetoken.kernels.norm_triton import (
        add_rms_norm_triton,
        embed_rms_norm_triton,
        rms_norm_triton,
        v4_rms_norm_triton,
    )
    from freetoken.layers.hyper_connections import unweighted_rms, v4_rms_norm  # torch on CPU tensors

    for rows, n in ((1, 64), (3, 128), (5, 2048), (7, 100)):
        x, d, w = _case(rows, n, dtype, device)
        xc, wc = x.cpu(), w.cpu().float()  # DeepSeek-V4's forms: float32 weights, their own rounding
        torch.testing.assert_close(v4_rms_norm_triton(x, w.float(), 1e-6).cpu(), v4_rms_norm(xc, wc, 1e-6), rtol=tol,
                                   atol=tol)  # fmt: skip
        torch.testing.assert_close(v4_rms_norm_triton(x, None, 1e-6).cpu(), unweighted_rms(xc, 1e-6), rtol=tol,
                                   atol=tol)  # fmt: skip
        torch.testing.assert_close(rms_norm_triton(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), rtol=tol, atol=tol)
        s, y = add_rms_norm_triton(x, d, w, 1e-6)
        torch.testing.assert_close(s, x + d, rtol=0, atol=0)
        torch.testing.assert_close(y, rms_norm_reference(x + d, w, 1e-6), rtol=tol, atol=tol)
        ids = torch.tensor([rows - 1, 0, rows - 1][: max(1, rows)], device=device)  # embedding rows, repeated
        h, y = embed_rms_norm_triton(ids, x, w, 1e-6)
        assert torch.equal(h, x[ids])
        torch.testing.assert_close(y, rms_norm_reference(x[ids], w, 1e-6), rtol=tol, atol=tol)
        heads = x.view(rows, -1, n // 2) if n % 2 == 0 else None  # per-head rows, as q/k norms use it
        if heads is not None:
            wh = w[: n // 2]
            torch.testing.assert_close(rms_norm_triton(heads, wh, 1e-6), rms_norm_reference(heads, wh, 1e-6),
                                       rtol=tol, atol=tol)  # fmt: skip


def test_add_rms_norm_on_a_cpu() -> None:
    """float32 rows take the C++ op (``kernels/cpu_step``, its own test file), other dtypes the reference itself."""
    x, d, w = _case(4, 32, torch.float32, "cpu")
    s, y = add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(s, x + d)
    torch.testing.assert_close(y, rms_norm_reference(x + d, w, 1e-6), rtol=1e-6, atol=1e-6)
    x, d, w = (t.double() for t in (x, d, w))
    s, y = add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(s, x + d) and torch.equal(y, rms_norm_reference(x + d, w, 1e-6))


@TRITON_INTERPRETER
def test_kernel_in_the_interpreter() -> None:
    _check("cpu", torch.float32, 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_kernel_on_cuda(dtype: torch.dtype, tol: float) -> None:
    _check("cuda", dtype, tol)
