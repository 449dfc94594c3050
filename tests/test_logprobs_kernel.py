"""The sampler's logprobs in two launches (``kernels/logprobs_triton.py``) against ``torch.log_softmax`` and
``torch.topk``: Triton's interpreter on the CPU, the kernel on CUDA. The sampled token's logprob and the row's best
logprobs agree within float32 rounding, the best ids are the row's best tokens best first (ties: the lower id), and
the sampler returns them on CUDA."""

from __future__ import annotations

import pytest
import torch

from devices import _NO_INTERPRETER
from freetoken.runner.sampler import MAX_TOP_LOGPROBS, Features, SamplingBatch, sample_batch

DEVICES = [
    pytest.param("cpu", marks=[pytest.mark.interp, _NO_INTERPRETER]),  # Triton's interpreter
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
]


def _logits(B: int, V: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g) * torch.tensor([0.5, 2.0, 6.0, 12.0])[torch.arange(B) % 4, None] - 3.0
    x[torch.rand(B, V, generator=g) < 0.05] = float("-inf")
    x[:, 11] = x[:, 2]  # a tie
    x[0, 4000:] = float("-inf")  # whole blocks of -inf
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V, n", [(5003, 20), (9000, 5), (300, 1)])
def test_logprobs_are_log_softmaxs(device: str, V: int, n: int) -> None:
    from freetoken.kernels.logprobs_triton import logprobs_triton

    B = 4
    x = _logits(B, V, V)
    ids = torch.tensor([3, 7, 2, 11]) % V
    ids[0] = int(x[0].argmax())
    lp, tv, ti = (t.cpu() for t in logprobs_triton(x.to(device), ids.to(device), n))
    ref = torch.log_softmax(x.double(), dim=-1)
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :n]  # ties: the lower id first
    assert torch.equal(ti, order)
    assert torch.allclose(tv.double(), ref.gather(1, order), atol=2e-5, rtol=0)
    want = ref.gather(1, ids[:, None])[:, 0]
    finite = torch.isfinite(want)
    assert torch.allclose(lp.double()[finite], want[finite], atol=2e-5, rtol=0)
    assert not torch.isfinite(lp[~finite]).any()


@pytest.mark.parametrize("device", DEVICES)
def test_sample_batch_returns_them(device: str) -> None:
    """Through ``sample_batch`` with logprobs asked (greedy rows): the argmax, its logprob, the best 20."""
    B, V = 3, 4099
    x = _logits(B, V, 1)
    z = torch.zeros(B, dtype=torch.int64)
    b = SamplingBatch(temperature=torch.zeros(B), top_k=z, top_p=torch.ones(B), min_p=torch.zeros(B), seed_lo=z,
                      seed_hi=z, step=z, rows=z, presence=torch.zeros(B), frequency=torch.zeros(B),
                      repetition=torch.ones(B))  # fmt: skip
    f = Features(draw=False, cuts=False, penalties=False, logprobs=True)
    out = sample_batch(x.to(device), SamplingBatch(**{k: v.to(device) for k, v in vars(b).items()}), features=f)
    ref = torch.log_softmax(x, dim=-1)
    assert torch.equal(out.ids.cpu(), x.argmax(dim=-1))
    assert out.logprob is not None and out.top_logprobs is not None and out.top_ids is not None
    assert torch.allclose(out.logprob.cpu(), ref.max(dim=-1).values, atol=2e-5)
    assert out.top_ids.shape == (B, MAX_TOP_LOGPROBS)
    assert torch.allclose(out.top_logprobs.cpu(), torch.topk(ref, MAX_TOP_LOGPROBS).values, atol=2e-5)


def test_bad_arguments_are_refused() -> None:
    from freetoken.kernels.logprobs_triton import logprobs_triton

    ids = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="float32"):
        logprobs_triton(torch.zeros(1, 10, dtype=torch.float64), ids, 5)
    with pytest.raises(ValueError, match="out of range"):
        logprobs_triton(torch.zeros(1, 10), ids, 65)
