"""The sort-free top-p / min-p cut (``kernels/nucleus_triton.py``) against the sampler's sorted cut (``_cut``):
Triton's interpreter on the CPU, the kernel on CUDA (and replayed from a CUDA graph). The kept sets are equal except
for tokens whose mass ranked before them is within float32 rounding of ``top_p`` (sums in another order), and
tokens tied with the smallest kept logit, which are all kept (the sort keeps those its order puts first); kept
logits keep their values; the same input gives the same bits; the sampler takes it when no drawn row has a top-k."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from devices import _NO_INTERPRETER
from freetoken.runner.sampler import Features, SamplingBatch, _cut, sample_batch
from freetoken.runner.step_sampler import features_of

DEVICES = [
    pytest.param("cpu", marks=[pytest.mark.interp, _NO_INTERPRETER]),  # Triton's interpreter
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
]


def _kernel(z: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor, **launch: int) -> torch.Tensor:
    from freetoken.kernels.nucleus_triton import nucleus_cut_triton

    return nucleus_cut_triton(z, top_p, min_p, **launch)


def _batch(top_p: torch.Tensor, min_p: torch.Tensor) -> SamplingBatch:
    B, i64 = top_p.shape[0], torch.int64
    zero = torch.zeros(B, dtype=i64)
    return SamplingBatch(temperature=torch.ones(B), top_k=zero, top_p=top_p, min_p=min_p, seed_lo=zero, seed_hi=zero,
                         step=zero, rows=zero, presence=torch.zeros(B), frequency=torch.zeros(B),
                         repetition=torch.ones(B))  # fmt: skip


def _rows(B: int, V: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits of several spreads (peaked to nearly flat), some tokens at -inf, each row's best at 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g) * torch.tensor([0.3, 1.0, 3.0, 8.0])[torch.arange(B) % 4, None]
    x[torch.rand(B, V, generator=g) < 0.1] = float("-inf")
    top_p = torch.tensor([0.5, 0.9, 0.95, 0.99, 0.3, 1.0])[torch.arange(B) % 6]
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.2])[torch.arange(B) % 5]
    return x - x.max(dim=-1, keepdim=True).values, top_p, min_p


def _check(z: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor, got: torch.Tensor) -> None:
    ref = _cut(z, _batch(top_p, min_p))
    w = torch.exp(z.double())
    for r in range(z.shape[0]):
        kept, want = torch.isfinite(got[r]), torch.isfinite(ref[r])
        assert torch.equal(got[r][kept], z[r][kept])  # kept logits unchanged
        assert bool(kept[z[r].argmax()])  # the best token stays
        # where the two differ: a tie with the smallest kept logit, or a mass before within rounding of top_p
        before = torch.tensor([float(w[r][z[r] > v].sum()) for v in z[r][kept != want].double()])
        tie = torch.isin(z[r][kept != want], z[r][kept].min())
        near = (before - float(top_p[r]) * float(w[r].sum())).abs() <= 1e-5 * float(w[r].sum())
        minp = (w[r][kept != want] - float(min_p[r])).abs() <= 1e-6
        assert bool((tie | near | minp).all()), (r, int((kept != want).sum()))
        assert int(kept.sum()) >= 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B, V", [(6, 1000), (5, 7001)])
def test_the_kept_set_is_the_sorted_cuts(device: str, B: int, V: int) -> None:
    for seed in range(2):
        z, top_p, min_p = _rows(B, V, seed)
        got = _kernel(z.to(device), top_p.to(device), min_p.to(device)).cpu()
        _check(z, top_p, min_p, got)
        again = _kernel(z.to(device), top_p.to(device), min_p.to(device)).cpu()
        assert torch.equal(got, again)  # no atomics: the same bits


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block, num_warps", [(512, 4), (1024, 8), (4096, 8)])
def test_other_blocks_keep_the_same_set(device: str, block: int, num_warps: int) -> None:
    """The launch shapes sample_time.py's sweep times: the same kept set as the default's (up to the order of the
    mass sums: the same check against the sorted cut)."""
    z, top_p, min_p = _rows(5, 7001, 3)
    got = _kernel(z.to(device), top_p.to(device), min_p.to(device), block=block, num_warps=num_warps).cpu()
    _check(z, top_p, min_p, got)
    with pytest.raises(ValueError, match="power of 2"):
        _kernel(z.to(device), top_p.to(device), min_p.to(device), block=1000)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_at_the_threshold_are_all_kept(device: str) -> None:
    """A flat row: every token ties with the best, so top-p keeps them all (the sort would keep about top_p of them,
    whichever its order puts first); a row of two levels keeps the upper level whole."""
    V = 3000
    z = torch.zeros(2, V)
    z[1, V // 3 :] = -1.0
    got = _kernel(z.to(device), torch.tensor([0.5, 0.2]).to(device), torch.zeros(2).to(device)).cpu()
    assert torch.isfinite(got[0]).all()
    assert torch.isfinite(got[1, : V // 3]).all() and not torch.isfinite(got[1, V // 3 :]).any()


def test_the_sampler_takes_it_when_no_drawn_row_has_a_top_k() -> None:
    def req(temperature: float, top_k: int, top_p: float) -> SimpleNamespace:
        p = SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=0.0, greedy=temperature < 1e-5,
                            has_penalties=False, logprobs=None)  # fmt: skip
        return SimpleNamespace(params=p, constraint=None)

    assert features_of([req(1.0, 0, 0.9), req(0.0, 5, 1.0)]).nucleus  # the greedy row's top_k does not count
    assert not features_of([req(1.0, 0, 0.9), req(0.7, 5, 1.0)]).nucleus  # a drawn row with a top_k: the sort
    assert not features_of([req(1.0, 0, 1.0)]).nucleus  # no cut at all


@pytest.mark.parametrize("device", DEVICES)
def test_sample_batch_draws_from_the_cut(device: str) -> None:
    """Through ``sample_batch`` (the nucleus feature): every drawn token is one the sorted cut keeps or ties."""
    B, V = 4, 2000
    z, top_p, _ = _rows(B, V, 5)
    b = _batch(top_p, torch.zeros(B))
    b.seed_lo = torch.arange(B, dtype=torch.int64) * 11
    f = Features(draw=True, cuts=True, penalties=False, logprobs=False, nucleus=True)
    dev_b = SamplingBatch(**{k: v.to(device) for k, v in vars(b).items()})
    ids = sample_batch(z.to(device), dev_b, features=f).ids.cpu()
    ref = _cut(z, b)
    for r in range(B):
        assert torch.isfinite(ref[r, ids[r]]) or z[r, ids[r]] == ref[r][torch.isfinite(ref[r])].min(), r


@pytest.mark.parametrize("device", DEVICES)
def test_the_cut_takes_raw_logits_and_temperatures(device: str) -> None:
    """Unshifted logits and per-row temperatures (a greedy row's, 0, cut at 1): the kept set is the sorted cut's of
    ``(x - max x) / t``, and the kept tokens keep their logits x (the draw shifts and scales them itself)."""
    z, top_p, min_p = _rows(6, 3001, 7)
    x = z * 1.5 + torch.arange(6.0)[:, None] * 3.0  # another scale and shift per row
    temp = torch.tensor([1.5, 0.7, 0.0, 2.0, 1.0, 0.3])
    t = torch.where(temp < 1e-5, torch.ones(6), temp)
    from freetoken.kernels.nucleus_triton import nucleus_cut_triton

    got = nucleus_cut_triton(x.to(device), top_p.to(device), min_p.to(device), temp.to(device)).cpu()
    kept = torch.isfinite(got)
    assert torch.equal(got[kept], x[kept])
    zt = (x - x.max(dim=-1, keepdim=True).values) / t[:, None]
    _check(zt, top_p, min_p, torch.where(kept, zt, float("-inf")))


@pytest.mark.parametrize("device", DEVICES)
def test_sample_batch_cut_keeps_greedy_rows_greedy(device: str) -> None:
    """Through ``sample_batch`` at other temperatures: a greedy row (temperature 0) takes argmax x, the drawn rows a
    token the sorted cut of their scaled logits keeps (or ties)."""
    B, V = 4, 2000
    z, top_p, _ = _rows(B, V, 9)
    x = z * 2.0 + 5.0
    b = _batch(top_p, torch.zeros(B))
    b.temperature = torch.tensor([0.0, 0.6, 1.4, 1.0])
    b.seed_lo = torch.arange(B, dtype=torch.int64) * 7
    f = Features(draw=True, cuts=True, penalties=False, logprobs=False, nucleus=True)
    dev_b = SamplingBatch(**{k: v.to(device) for k, v in vars(b).items()})
    ids = sample_batch(x.to(device), dev_b, features=f).ids.cpu()
    assert int(ids[0]) == int(x[0].argmax())
    t = torch.where(b.temperature < 1e-5, torch.ones(B), b.temperature)
    zt = (x - x.max(dim=-1, keepdim=True).values) / t[:, None]
    ref = _cut(zt, b)
    for r in range(1, B):
        assert torch.isfinite(ref[r, ids[r]]) or zt[r, ids[r]] == ref[r][torch.isfinite(ref[r])].min(), r


@pytest.mark.parametrize("device", DEVICES)
def test_the_fused_draw_is_the_draw_of_the_cut(device: str) -> None:
    """``nucleus_draw_triton`` (the masking pass takes the draw's partials) picks what the draw picks from the cut
    logits, bit for bit: drawn rows at several temperatures, a greedy row (its argmax), min-p rows, several steps."""
    from freetoken.kernels.draw_triton import gumbel_argmax_triton
    from freetoken.kernels.nucleus_triton import nucleus_cut_triton, nucleus_draw_triton

    z, top_p, min_p = _rows(6, 5003, 11)
    x = (z * 1.3 + 2.0).to(device)
    temp = torch.tensor([1.0, 0.0, 0.7, 1.6, 1.0, 0.4]).to(device)
    lo = torch.arange(6, dtype=torch.int64).to(device) * 977
    hi = torch.full((6,), 5, dtype=torch.int64).to(device)
    tp, mp = top_p.to(device), min_p.to(device)
    for s in range(3):
        step = torch.full((6,), s, dtype=torch.int64).to(device)
        want = gumbel_argmax_triton(nucleus_cut_triton(x, tp, mp, temp), temp, lo, hi, step)
        got = nucleus_draw_triton(x, temp, tp, mp, lo, hi, step)
        assert torch.equal(got.cpu(), want.cpu()), s
        assert int(got[1]) == int(x[1].argmax())
