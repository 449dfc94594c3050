"""The top-k cut and draw without a sort (``kernels/topk_triton.py``) against the sampler's sorted cut (``_cut`` with
``Features.top_k``) and the draw of ``draw_triton`` on its cut logits: Triton's interpreter on the CPU, the kernel on
CUDA. The kept tokens are the sorted cut's (up to a mass before them within float32 rounding of ``top_p``), best
first with their ``(x - max x) / t``; the drawn token is the draw's on the torch cut, bit for bit; a greedy row's is
its argmax; the sampler takes it when every drawn row has a top-k within ``K_LIMIT``."""

from __future__ import annotations

import pytest
import torch

from devices import _NO_INTERPRETER
from freetoken.runner.sampler import Features, SamplingBatch, _cut, sample_batch

DEVICES = [
    pytest.param("cpu", marks=[pytest.mark.interp, _NO_INTERPRETER]),  # Triton's interpreter
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
]


def _batch(B: int, seed: int) -> SamplingBatch:
    """Rows of several temperatures (one greedy), top-k, top-p and min-p settings, seeds and steps."""
    i64 = torch.int64
    return SamplingBatch(
        temperature=torch.tensor([1.0, 0.0, 0.7, 1.6, 1.0, 0.4])[torch.arange(B) % 6],
        top_k=torch.tensor([20, 5, 32, 1, 7, 13])[torch.arange(B) % 6].to(i64),
        top_p=torch.tensor([0.8, 1.0, 0.95, 0.5, 1.0, 0.3])[torch.arange(B) % 6],
        min_p=torch.tensor([0.0, 0.0, 0.05, 0.0, 0.2, 0.0])[torch.arange(B) % 6],
        seed_lo=torch.arange(B, dtype=i64) * 977 + seed, seed_hi=torch.full((B,), 5, dtype=i64),
        step=torch.full((B,), seed, dtype=i64), rows=torch.zeros(B, dtype=i64), presence=torch.zeros(B),
        frequency=torch.zeros(B), repetition=torch.ones(B),
    )  # fmt: skip


def _logits(B: int, V: int, seed: int) -> torch.Tensor:
    """Unshifted logits of several spreads, some at -inf, a few exact ties."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g) * torch.tensor([0.3, 1.0, 3.0, 8.0])[torch.arange(B) % 4, None] + 2.0
    x[torch.rand(B, V, generator=g) < 0.1] = float("-inf")
    x[:, 7] = x[:, 3]  # a tie (the lower id first)
    return x


def _torch_cut(x: torch.Tensor, b: SamplingBatch, k: int) -> torch.Tensor:
    """The sampler's torch path: ``(x - max x) / t`` (a greedy row's t 1), then ``_cut`` with the bound ``k``."""
    t = torch.where(b.temperature < 1e-5, torch.ones_like(b.temperature), b.temperature)
    return _cut((x - x.max(dim=-1, keepdim=True).values) / t[:, None], b, k)


def _on(b: SamplingBatch, device: str) -> SamplingBatch:
    return SamplingBatch(**{n: v.to(device) for n, v in vars(b).items()})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B, V, k, block", [(6, 3001, 32, 4096), (6, 5003, 32, 512), (4, 2000, 16, 256)])
def test_the_kept_tokens_are_the_sorted_cuts(device: str, B: int, V: int, k: int, block: int) -> None:
    from freetoken.kernels.topk_triton import topk_cut_triton

    x = _logits(B, V, 1)
    b = _batch(B, 0)
    b.top_k = b.top_k.clamp(max=k)
    d = _on(b, device)
    z, ids = (t.cpu() for t in topk_cut_triton(x.to(device), k, d.temperature, d.top_k, d.top_p, d.min_p,
                                                  block=block))  # fmt: skip
    ref = _torch_cut(x, b, k)
    t = torch.where(b.temperature < 1e-5, torch.ones(B), b.temperature)
    zt = (x - x.max(dim=-1, keepdim=True).values) / t[:, None]
    best = torch.sort(x, dim=-1, descending=True, stable=True)  # ties: the lower id first
    for r in range(B):
        assert torch.equal(ids[r].long(), best.indices[r, :k]), r  # the row's k best, best first, ties the lower id
        assert torch.equal(z[r], torch.where(torch.isfinite(z[r]), zt[r, ids[r].long()], z[r])), r  # their z
        kept = torch.zeros(V, dtype=torch.bool)
        kept[ids[r].long()[torch.isfinite(z[r])]] = True
        want = torch.isfinite(ref[r])
        differ = (kept != want).nonzero().flatten()
        w = torch.exp(zt[r].double())
        wk = w[best.indices[r, : min(int(b.top_k[r]), k)]]
        for i in differ.tolist():  # only a mass ranked before it within rounding of top_p
            before = float(w[zt[r] > zt[r, i]].sum())
            assert abs(before - float(b.top_p[r]) * float(wk.sum())) <= 1e-5 * float(wk.sum()), (r, i)
        assert bool(kept[x[r].argmax()]), r  # the best stays


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [16, 32, 64])
def test_the_draw_is_the_draw_of_the_cut(device: str, k: int) -> None:
    """``topk_draw_triton`` picks what ``draw_triton`` picks from the torch cut logits (the same kept sets here), bit
    for bit, over several steps; the greedy row takes its argmax."""
    from freetoken.kernels.draw_triton import gumbel_argmax_triton
    from freetoken.kernels.topk_triton import topk_draw_triton

    B, V = 6, 4099
    x = _logits(B, V, 2)
    for s in range(3):
        b = _batch(B, s)
        b.top_k = b.top_k.clamp(max=k)
        d = _on(b, device)
        cut = _torch_cut(x, b, k).to(device)
        ones = torch.ones(B, device=device)
        want = gumbel_argmax_triton(cut, ones, d.seed_lo, d.seed_hi, d.step, unit=True).cpu()
        want[1] = x[1].argmax()  # greedy
        got = topk_draw_triton(x.to(device), k, d.temperature, d.top_k, d.top_p, d.min_p, d.seed_lo, d.seed_hi,
                               d.step).cpu()  # fmt: skip
        assert torch.equal(got, want), s


@pytest.mark.parametrize("device", DEVICES)
def test_sample_batch_takes_it_for_a_top_k_step(device: str) -> None:
    """Through ``sample_batch`` (``Features.top_k`` 32, Qwen's settings): the token the torch path draws."""
    B, V = 4, 3001
    x = _logits(B, V, 3)
    b = _batch(B, 4)
    f = Features(draw=True, cuts=True, penalties=False, logprobs=False, top_k=32)
    got = sample_batch(x.to(device), _on(b, device), features=f).ids.cpu()
    from freetoken.kernels.draw_triton import gumbel_argmax_triton

    want = gumbel_argmax_triton(_torch_cut(x, b, 32).to(device), torch.ones(B, device=device),
                                *(v.to(device) for v in (b.seed_lo, b.seed_hi, b.step)), unit=True).cpu()  # fmt: skip
    want[1] = x[1].argmax()
    assert torch.equal(got, want)


def test_bad_bounds_are_refused() -> None:
    from freetoken.kernels.topk_triton import topk_cut_triton

    x, one = torch.zeros(1, 10), torch.ones(1)
    for k in (0, 3, 128):
        with pytest.raises(ValueError, match="power of 2"):
            topk_cut_triton(x, k, one, torch.zeros(1, dtype=torch.int64), one, one * 0)
    with pytest.raises(ValueError, match="float32"):
        topk_cut_triton(x.double(), 16, one, torch.zeros(1, dtype=torch.int64), one, one * 0)


def test_a_step_mixing_rows_with_and_without_a_top_k() -> None:
    """``features_of``: drawn rows with a top-k beside drawn rows without one make a mixed step (the bound over those
    that have one); a uniform step, or one whose top-k rows are greedy, does not."""
    from types import SimpleNamespace

    from freetoken.runner.step_sampler import features_of

    def req(temperature: float, top_k: int, top_p: float) -> SimpleNamespace:
        p = SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=0.0, greedy=temperature < 1e-5,
                            has_penalties=False, logprobs=None)  # fmt: skip
        return SimpleNamespace(params=p, constraint=None)

    mixed = features_of([req(1.0, 20, 0.8), req(0.7, 0, 0.95), req(0.0, 0, 1.0)])
    assert (mixed.mixed_top_k, mixed.top_k, mixed.nucleus) == (32, 0, False)
    assert features_of([req(1.0, 20, 0.8), req(0.7, 40, 0.95)]).mixed_top_k == 0  # every drawn row has one
    assert features_of([req(0.0, 20, 0.8), req(0.7, 0, 0.95)]).mixed_top_k == 0  # the top-k row is greedy
    assert features_of([req(1.0, 2000, 0.8), req(0.7, 0, 0.95)]).mixed_top_k == 0  # above TOP_K_MAX: the sort


@pytest.mark.parametrize("device", DEVICES)
def test_a_mixed_step_takes_each_rows_own_draw(device: str) -> None:
    """Through ``sample_batch`` with ``mixed_top_k`` and the kernels on (the interpreter on the CPU): rows with a top-k
    get ``topk_draw_triton``'s token, the others ``nucleus_draw_triton``'s, a greedy row its argmax."""
    from unittest import mock

    from freetoken.kernels.nucleus_triton import nucleus_draw_triton
    from freetoken.kernels.topk_triton import topk_draw_triton
    from freetoken.runner import sampler

    B, V = 6, 3001
    x = _logits(B, V, 5).to(device)
    b = _batch(B, 1)
    b.top_k = torch.tensor([20, 0, 0, 5, 0, 13])
    d = _on(b, device)
    f = Features(draw=True, cuts=True, penalties=False, logprobs=False, mixed_top_k=20)
    with mock.patch.object(sampler, "use_triton", lambda where: True):
        got = sample_batch(x, d, features=f).ids.cpu()
    args = (d.temperature, d.top_k, d.top_p, d.min_p, d.seed_lo, d.seed_hi, d.step)
    by_k = topk_draw_triton(x, 32, *args).cpu()
    by_p = nucleus_draw_triton(x, d.temperature, d.top_p, d.min_p, d.seed_lo, d.seed_hi, d.step).cpu()
    has_k = b.top_k > 0
    assert torch.equal(got[has_k], by_k[has_k]) and torch.equal(got[~has_k], by_p[~has_k])
    assert int(got[1]) == int(x[1].argmax())  # greedy
