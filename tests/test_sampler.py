"""The batched device sampler: greedy, the exact distribution of temperature sampling, top-k / top-p /
min-p supports, seeds that give the same draw in any batch, penalties, masks, logprobs; CPU and CUDA."""

from __future__ import annotations

import math

import pytest
import torch

from devices import DEVICES
from freetoken.runner import noise
from freetoken.runner.constraint import apply_bitmask
from freetoken.runner.sampler import Features, PenaltyState, SamplingBatch, sample_batch
from freetoken.runner.sampling_params import SamplingParams


def _batch(n: int, device: str, **per_row: object) -> SamplingBatch:
    def col(name: str, default: float, dtype: torch.dtype) -> torch.Tensor:
        v = per_row.get(name, default)
        vals = list(v) if isinstance(v, (list, tuple)) else [v] * n  # type: ignore[arg-type]
        return torch.tensor(vals, dtype=dtype, device=device)

    f, i = torch.float32, torch.int64
    return SamplingBatch(
        temperature=col("temperature", 1.0, f), top_k=col("top_k", 0, i), top_p=col("top_p", 1.0, f),
        min_p=col("min_p", 0.0, f), seed_lo=col("seed", 0, i), seed_hi=col("seed_hi", 0, i),
        step=col("step", 0, i), rows=col("rows", 0, i), presence=col("presence", 0.0, f),
        frequency=col("frequency", 0.0, f), repetition=col("repetition", 1.0, f),
    )  # fmt: skip


PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def _draws(logits: torch.Tensor, device: str, steps: int, **kw: object) -> list[int]:
    """One row, ``steps`` consecutive draws of a seeded request."""
    x = logits.to(device)[None, :].expand(steps, -1).contiguous()
    b = _batch(steps, device, step=list(range(steps)), seed=7, **kw)
    return sample_batch(x, b).ids.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_rows_take_the_argmax(device: str) -> None:
    x = torch.randn(6, 50, device=device)
    b = _batch(6, device, temperature=[0, 1e-40, 5e-324, 9e-6, 0, 0])
    assert sample_batch(x, b).ids.tolist() == x.argmax(dim=-1).tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_draws_follow_the_tempered_distribution(device: str, temperature: float) -> None:
    n = 20_000
    counts = torch.bincount(torch.tensor(_draws(PROBS.log(), device, n, temperature=temperature)), minlength=4)
    want = torch.softmax(PROBS.log() / temperature, dim=0)
    # each frequency within 5 standard deviations of its expectation
    sd = (want * (1 - want) / n).sqrt()
    assert ((counts / n - want).abs() <= 5 * sd + 1e-9).all(), (counts / n, want)


@pytest.mark.parametrize("device", DEVICES)
def test_a_seed_draws_the_same_tokens_in_any_batch(device: str) -> None:
    x = torch.randn(1, 300).repeat(5, 1).to(device)
    alone = sample_batch(x[:1], _batch(1, device, seed=42, step=3)).ids.item()
    mixed = sample_batch(x, _batch(5, device, seed=[1, 42, 9, 42, 5], step=[0, 3, 3, 3, 7])).ids.tolist()
    assert mixed[1] == mixed[3] == alone
    assert len({*_draws(x[0].cpu(), device, 40)}) > 5  # and successive steps differ


def test_the_noise_is_the_same_on_every_device() -> None:
    keys = noise.row_keys(torch.tensor([0, 2**32 - 1, 12345]), torch.tensor([0, 7, 2**32 - 1]), torch.tensor([0, 1, 9]))
    u = noise.uniform(keys, 1000)
    assert 0 < u.min() and u.max() < 1 and abs(float(u.mean()) - 0.5) < 0.02
    if torch.cuda.is_available():
        cu = noise.uniform(keys.cuda(), 1000).cpu()
        assert torch.equal(u, cu)
    assert noise.split_seed(-1) == (2**32 - 1, 2**32 - 1) and noise.split_seed(2**64 - 1) == noise.split_seed(-1)


def test_no_draw_is_exactly_0_or_1() -> None:
    """A draw of 1.0 is Gumbel noise of +inf: a masked token's -inf + inf is NaN, which argmax picks."""
    u = noise.unit(torch.tensor([0, 1, 2**31, 2**32 - 512, 2**32 - 1], dtype=torch.int64))
    assert u.dtype == torch.float32 and bool((u > 0).all()) and bool((u < 1).all())
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


@pytest.mark.parametrize("device", DEVICES)
def test_top_k_top_p_min_p_restrict_the_support(device: str) -> None:
    logits = PROBS.log()
    assert set(_draws(logits, device, 400, top_k=2)) == {0, 1}
    # top_p 0.7: 0.5 alone < 0.7, so tokens 0 and 1 stay; token 2 starts after 0.8 of the mass
    assert set(_draws(logits, device, 400, top_p=0.7)) == {0, 1}
    assert set(_draws(logits, device, 400, min_p=0.5)) == {0, 1}  # 0.15 < 0.5 * 0.5
    assert set(_draws(logits, device, 400, top_k=3, top_p=0.9)) == {0, 1, 2}
    assert set(_draws(logits, device, 50, top_p=1e-9)) == {0}  # the top token always stays


@pytest.mark.parametrize("device", DEVICES)
def test_penalties_as_openai_and_hugging_face_define_them(device: str) -> None:
    V = 8
    state = PenaltyState(2, V, torch.device(device))
    state.reset(0, [1, 2])  # prompt tokens: seen
    state.update(torch.tensor([0, 0, 0], device=device), torch.tensor([3, 3, 2], device=device))
    x = torch.tensor([[1.0, 2.0, -2.0, 4.0, 0.5, 0.0, 0.0, 0.0]], device=device)
    b = _batch(1, device, presence=0.5, frequency=0.25, repetition=2.0)
    from freetoken.runner.sampler import apply_penalties

    got = apply_penalties(x, b, state)[0].tolist()
    # token 1: prompt only -> 2/2; token 2: prompt and once -> -2*2 - 0.5 - 0.25; token 3: twice -> 4/2 - 0.5 - 0.5
    assert got == pytest.approx([1.0, 1.0, -4.75, 1.0, 0.5, 0.0, 0.0, 0.0])
    assert sample_batch(x, _batch(1, device, temperature=0, repetition=2.0, presence=2.0), state).ids.item() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_bitmask_keeps_only_allowed_tokens(device: str) -> None:
    V = 70
    allowed = [3, 31, 32, 69]
    mask = torch.zeros((2, math.ceil(V / 32)), dtype=torch.int64)
    for t in allowed:
        mask[:, t // 32] |= 1 << (t % 32)
    mask = mask.to(torch.int32).to(device)  # int32 words: bit 31 makes a word negative
    x = torch.randn(2, V, device=device)
    kept = torch.isfinite(apply_bitmask(x, mask))
    assert kept[0].nonzero().flatten().tolist() == allowed
    ids = sample_batch(x, _batch(2, device, temperature=[0, 1.0]), bitmask=mask).ids.tolist()
    assert all(i in allowed for i in ids)


@pytest.mark.parametrize("device", DEVICES)
def test_logprobs_are_of_the_raw_distribution(device: str) -> None:
    x = torch.randn(3, 40, device=device)
    out = sample_batch(x, _batch(3, device, temperature=[0, 0.7, 1.3], top_k=5), features=Features())
    lp = torch.log_softmax(x, dim=-1)
    assert out.logprob is not None and out.top_ids is not None and out.top_logprobs is not None
    torch.testing.assert_close(out.logprob, lp.gather(1, out.ids[:, None])[:, 0])
    assert out.top_ids[:, 0].tolist() == x.argmax(dim=-1).tolist()
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()


def test_bad_params_raise() -> None:
    bad = [
        {"max_tokens": 0}, {"temperature": -1}, {"top_p": 0.0}, {"stop": [""]}, {"min_p": 1.5},
        {"presence_penalty": 3}, {"frequency_penalty": float("nan")}, {"repetition_penalty": 0},
        {"logprobs": 21}, {"logprobs": -1},
    ]  # fmt: skip
    for kwargs in bad:
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)  # type: ignore[arg-type]
