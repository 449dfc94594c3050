"""The torch gated delta rule: the chunked form (a UT transform per chunk, its triangular inverse by blocks) against
the token-by-token recurrence, and the inverse against torch.linalg.inv."""

from __future__ import annotations

import pytest
import torch

from freetoken.layers.gated_delta import chunk_gated_delta, l2norm, recurrent_gated_delta, unit_lower_inverse


@pytest.mark.parametrize("c,block", [(64, 16), (32, 16), (24, 16), (16, 4)])
def test_unit_lower_inverse(c: int, block: int) -> None:
    g = torch.Generator().manual_seed(c)
    a = torch.randn((3, 2, c, c), generator=g, dtype=torch.float64) * 0.3  # diagonal and upper part ignored
    unit = torch.eye(c, dtype=torch.float64) + a.tril(-1)
    inv = unit_lower_inverse(a, block)
    assert torch.allclose(inv, torch.linalg.inv(unit), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("n,chunk", [(1, 64), (63, 64), (200, 64), (130, 32)])
def test_chunked_matches_the_recurrence(n: int, chunk: int) -> None:
    g = torch.Generator().manual_seed(n)
    H, dk, dv = 3, 16, 8
    q = l2norm(torch.randn((n, H, dk), generator=g)) * dk**-0.5
    k = l2norm(torch.randn((n, H, dk), generator=g))
    v = torch.randn((n, H, dv), generator=g)
    decay = -torch.rand((n, H), generator=g) * 0.5
    beta = torch.rand((n, H), generator=g)
    state = torch.randn((H, dk, dv), generator=g)
    out, last = chunk_gated_delta(q, k, v, decay, beta, state, chunk)
    s, ref = state[None], []
    for t in range(n):
        o, s = recurrent_gated_delta(q[t : t + 1], k[t : t + 1], v[t : t + 1], decay[t : t + 1], beta[t : t + 1], s)
        ref.append(o[0])
    assert torch.allclose(out, torch.stack(ref), atol=1e-5)
    assert torch.allclose(last, s[0], atol=1e-5)
