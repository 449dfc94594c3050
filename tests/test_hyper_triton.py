"""DeepSeek-V4's hyper-connection weights in one Triton launch (``kernels/hyper_triton.py``) against the torch
reference (``layers/hyper_connections.hc_weights_reference``): Triton's interpreter on the CPU (CI's interp stage) and
CUDA (marked ``gpu``); n a power of two (V4's 4) and not; one Sinkhorn iteration and V4's 20; bad shapes refused."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_CASES
from freetoken.layers.hyper_connections import hc_weights_reference

CASES = [(4, 20, 5), (4, 1, 1), (3, 7, 4), (2, 20, 3)]  # (n, iters, tokens)


def _case(n: int, T: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = (2 + n) * n
    mix = torch.randn((T, width + 3), generator=g)[:, 1 : width + 1] * 3  # rows strided, as a slice of a wider tensor
    base = torch.randn(width, generator=g)
    scale = torch.rand(3, generator=g) + 0.5
    return mix.to(device), base.to(device), scale.to(device)


def _check(device: str) -> None:
    from freetoken.kernels.hyper_triton import hc_weights_triton

    for i, (n, iters, T) in enumerate(CASES):
        mix, base, scale = _case(n, T, device, seed=i)
        got = hc_weights_triton(mix, base, scale, n, iters, 1e-6)
        want = hc_weights_reference(mix, base, scale, n, iters, 1e-6)
        for g, w, what in zip(got, want, ("pre", "post", "comb")):
            assert g.shape == w.shape and g.dtype == torch.float32, what
            torch.testing.assert_close(g, w, rtol=2e-6, atol=2e-7, msg=f"{what} n={n} iters={iters}")
        # the last normalisation is the columns': each sums to s / (s + eps), below 1 by eps / s for a column that
        # summed to s before it (1.007e-5 on the H100 for a small s, 2026-12-07: the reference agrees within 2e-6)
        cols = got[2].sum(-2)
        assert bool((cols <= 1 + 1e-6).all()), cols
        torch.testing.assert_close(cols, torch.ones_like(cols), rtol=0, atol=1e-4)
    empty = hc_weights_triton(torch.zeros((0, 24), device=device), torch.zeros(24, device=device), scale, 4, 20, 1e-6)
    assert [tuple(t.shape) for t in empty] == [(0, 4), (0, 4), (0, 4, 4)]


@pytest.mark.parametrize("device,dtype", [c for c in TRITON_CASES if c.values[1] == torch.float32])
def test_kernel(device: str, dtype: torch.dtype) -> None:  # the weights are float32 whatever the model's dtype
    _check(device)


def test_bad_shapes_are_refused() -> None:
    pytest.importorskip("triton")
    from freetoken.kernels.hyper_triton import hc_weights_triton

    mix, base, scale = _case(4, 2, "cpu")
    with pytest.raises(ValueError, match="hyper-connection weights"):
        hc_weights_triton(mix[:, :-1], base, scale, 4, 20, 1e-6)
    with pytest.raises(ValueError, match="hyper-connection weights"):
        hc_weights_triton(mix, base, scale, 4, 0, 1e-6)
