"""The torch gated delta rule: the chunked form (a UT transform per chunk, a scan over chunks) against the
token-by-token recurrence, from a nonzero state, with a partial last chunk."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.gated_delta import chunk_gated_delta, l2norm, recurrent_gated_delta


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
