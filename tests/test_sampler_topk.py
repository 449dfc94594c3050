"""The top-k cut through torch.topk (``Features.top_k``: every drawn row has a top_k within the bound) keeps the same
tokens as the full sort of every row: the same cut logits and the same draws, top-p and min-p on top; and the
step's bound (``top_k_bound``) is 0 (the sort) wherever some drawn row has no top-k."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from devices import DEVICES
from freetoken.runner import sampler
from freetoken.runner.sampler import Features, SamplingBatch, sample_batch
from freetoken.runner.sampling_params import SamplingParams
from freetoken.runner.step_sampler import features_of, top_k_bound

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _batch(device: str, step: int) -> SamplingBatch:
    f, i = torch.float32, torch.int64

    def t(v: list[float], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(v, dtype=dtype, device=device)

    B = 6
    return SamplingBatch(
        temperature=t([1.0, 0.7, 0.0, 1.3, 1.0, 0.5], f), top_k=t([1, 5, 0, 20, 32, 7], i),
        top_p=t([1.0, 0.9, 1.0, 0.5, 0.95, 1.0], f), min_p=t([0.0, 0.0, 0.0, 0.05, 0.0, 0.1], f),
        seed_lo=t([3, 9, 4, 1, 7, 2], i), seed_hi=t([0] * B, i), step=t([step] * B, i), rows=t([0] * B, i),
        presence=t([0.0] * B, f), frequency=t([0.0] * B, f), repetition=t([1.0] * B, f),
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_topk_keeps_what_the_sort_keeps(device: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 3000, generator=g) * 2).to(device)
    x[4, 100:140] = 5.0 + torch.arange(40, device=device) * 1e-3  # near-equal logits across row 4's top-32 boundary
    sort = Features(draw=True, cuts=True, penalties=False, logprobs=False)
    topk = Features(draw=True, cuts=True, penalties=False, logprobs=False, top_k=32)
    drawn = torch.tensor([0, 1, 3, 4, 5])
    for step in range(40):
        b = _batch(device, step)
        z = (x - x.max(dim=-1, keepdim=True).values) / torch.where(b.temperature < 1e-5, 1.0, b.temperature)[:, None]
        assert torch.equal(sampler._cut(z, b, 32)[drawn.to(device)], sampler._cut(z, b)[drawn.to(device)])
        assert sample_batch(x, b, None, topk).ids.tolist() == sample_batch(x, b, None, sort).ids.tolist()


def test_the_bound_is_a_power_of_two_or_the_sort() -> None:
    assert [top_k_bound(k) for k in ([], [0], [-1], [5, 0], [3], [5, 20], [17], [1024], [1025])] == [
        0, 0, 0, 0, 16, 32, 32, 1024, 0,
    ]  # fmt: skip

    def req(temperature: float, top_k: int) -> SimpleNamespace:
        return SimpleNamespace(params=SamplingParams(temperature=temperature, top_k=top_k), constraint=None)

    assert features_of([req(1.0, 20), req(0.0, 0), req(0.8, 40)]).top_k == 64  # greedy rows don't count
    assert features_of([req(1.0, 20), req(0.8, 0)]).top_k == 0
    assert features_of([req(0.0, 0)]).top_k == 0
