"""The penalties in one launch (``kernels/penalty_triton.py``) against the sampler's torch ops (``apply_penalties``
on the CPU): Triton's interpreter on the CPU, the kernel on CUDA. Rows read their own state row (one shared, as
padding rows do); repetition divides positive and multiplies negative logits of seen tokens; presence and frequency
subtract by the counts; within a rounding of each (the compiler may contract a multiply and a subtract)."""

from __future__ import annotations

import pytest
import torch

from devices import _NO_INTERPRETER
from freetoken.runner.sampler import PenaltyState, SamplingBatch, apply_penalties

DEVICES = [
    pytest.param("cpu", marks=[pytest.mark.interp, _NO_INTERPRETER]),  # Triton's interpreter
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V", [300, 5003])
def test_the_kernel_is_the_torch_ops(device: str, V: int) -> None:
    from freetoken.kernels.penalty_triton import penalties_triton

    g = torch.Generator().manual_seed(V)
    B, R = 4, 3
    state = PenaltyState(R, V, torch.device("cpu"))
    for r in range(R):
        state.reset(r, torch.randint(0, V, (50,), generator=g).tolist())
        ids = torch.randint(0, V, (200,), generator=g)
        state.update(torch.full_like(ids, r), ids)
    x = torch.randn(B, V, generator=g) * 4.0
    z = torch.zeros(B)
    b = SamplingBatch(temperature=z, top_k=z.long(), top_p=z + 1, min_p=z, seed_lo=z.long(), seed_hi=z.long(),
                      step=z.long(), rows=torch.tensor([2, 0, 1, 2]), presence=torch.tensor([0.0, 1.5, -0.5, 0.3]),
                      frequency=torch.tensor([0.2, 0.0, 0.7, -0.1]),
                      repetition=torch.tensor([1.3, 1.0, 0.8, 2.0]))  # fmt: skip
    want = apply_penalties(x, b, state)
    got = penalties_triton(x.to(device), state.counts.to(device), state.seen.to(device), b.rows.to(device),
                           b.repetition.to(device), b.presence.to(device), b.frequency.to(device)).cpu()  # fmt: skip
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not torch.equal(want, x)  # the settings moved logits


def test_bad_state_is_refused() -> None:
    from freetoken.kernels.penalty_triton import penalties_triton

    x, one, rows = torch.zeros(1, 10), torch.ones(1), torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="state"):
        penalties_triton(x, torch.zeros(1, 10), torch.zeros(1, 10, dtype=torch.bool), rows, one, one, one)
    with pytest.raises(ValueError, match="float32"):
        penalties_triton(x.half(), torch.zeros(1, 10, dtype=torch.int32), torch.zeros(1, 10, dtype=torch.bool), rows,
                         one, one, one)  # fmt: skip
