"""The device sampler's pieces as the step graph runs them: every stage fixed-shape and free of host reads (the
capture checker refuses none of them at any bucket), the penalty state's scatters against plain loops, penalties,
logprobs and grammar masks against their torch references, seeded draws that depend on (seed, step) alone, and a
sampler captured once and replayed on rewritten static buffers giving the eager results. The checker itself is
tested on what a capture refuses."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from capture_check import CaptureBreaker, FakeCapture, forbid_capture_breakers
from freetoken.runner.constraint import apply_bitmask
from freetoken.runner.sampler import (
    MAX_TOP_LOGPROBS,
    Features,
    PenaltyState,
    SamplingBatch,
    apply_penalties,
    sample_batch,
)
from freetoken.runner.step_sampler import pack

V = 300
FEATURE_SETS = {
    "greedy": Features(draw=False, cuts=False, penalties=False, logprobs=False),
    "sample": Features(draw=True, cuts=True, penalties=False, logprobs=False),
    "penalties": Features(draw=True, cuts=False, penalties=True, logprobs=False),
    "logprobs": Features(draw=False, cuts=False, penalties=False, logprobs=True),
    "mask": Features(draw=True, cuts=False, penalties=False, logprobs=False, mask=True),
    "all": Features(draw=True, cuts=True, penalties=True, logprobs=True, mask=True),
    "nucleus": Features(draw=True, cuts=True, penalties=False, logprobs=False, nucleus=True),
}


def _batch(B: int, seed: int = 0) -> SamplingBatch:
    """B rows of varied settings: greedy and sampling rows, every cut, every penalty, distinct seeds and steps."""
    g = torch.Generator().manual_seed(seed)
    i64 = torch.int64
    return SamplingBatch(
        temperature=torch.tensor([0.0 if b % 3 == 0 else 0.5 + b / 4 for b in range(B)]),
        top_k=torch.tensor([b * 7 % 50 for b in range(B)], dtype=i64),
        top_p=torch.tensor([1.0 if b % 2 else 0.8 for b in range(B)]),
        min_p=torch.tensor([0.0 if b % 4 else 0.05 for b in range(B)]),
        seed_lo=torch.randint(0, 2**32, (B,), generator=g, dtype=i64),
        seed_hi=torch.randint(0, 2**32, (B,), generator=g, dtype=i64),
        step=torch.randint(0, 100, (B,), generator=g, dtype=i64),
        rows=torch.arange(B, dtype=i64),
        presence=torch.tensor([0.5 * (b % 2) for b in range(B)]),
        frequency=torch.tensor([0.25 * (b % 3) for b in range(B)]),
        repetition=torch.tensor([1.0 + 0.1 * (b % 4) for b in range(B)]),
    )


def _state(R: int, seed: int = 0) -> PenaltyState:
    g = torch.Generator().manual_seed(seed)
    s = PenaltyState(R, V, torch.device("cpu"))
    for r in range(R):
        s.reset(r, torch.randint(0, V, (5,), generator=g).tolist())
    s.update(torch.randint(0, R, (40,), generator=g), torch.randint(0, V, (40,), generator=g))
    return s


def _mask(B: int) -> torch.Tensor:
    """[B, ceil(V/32)] int32: row b allows tokens t with t % (b + 2) == 0."""
    words = torch.zeros((B, math.ceil(V / 32)), dtype=torch.int64)
    for b in range(B):
        for t in range(0, V, b + 2):
            words[b, t // 32] |= 1 << (t % 32)
    return words.to(torch.int32)


def _step(logits: torch.Tensor, b: SamplingBatch, state: PenaltyState, f: Features, mask: torch.Tensor) -> torch.Tensor:
    """What the step graph's body does after the logits (``StepGraphs._body``)."""
    s = sample_batch(logits, b, state, f, mask if f.mask else None)
    if f.penalties:
        state.update(b.rows, s.ids)
    return pack(s, f.logprobs)


@pytest.mark.parametrize("name", list(FEATURE_SETS))
@pytest.mark.parametrize("B", [1, 2, 4, 8])
def test_every_stage_is_capturable(name: str, B: int) -> None:
    f, b, state, mask = FEATURE_SETS[name], _batch(B), _state(B + 1), _mask(B)
    logits = torch.randn(B, V)
    with forbid_capture_breakers():
        out = _step(logits, b, state, f, mask)
    assert out.shape == (B, 2 + 2 * MAX_TOP_LOGPROBS if f.logprobs else 1)


def test_penalty_state_counts_every_sample_like_a_loop() -> None:
    R = 5
    state = PenaltyState(R, V, torch.device("cpu"))
    state.reset(1, [4, 4, 9])
    rows = torch.tensor([0, 1, 4, 4, 4, 1, 0])  # the shared row repeats (padding rows), row 1 twice
    ids = torch.tensor([3, 9, 7, 7, 8, 9, 5])
    state.update(rows, ids)
    counts = torch.zeros((R, V), dtype=torch.int32)
    seen = torch.zeros((R, V), dtype=torch.bool)
    seen[1, 4] = seen[1, 9] = True
    for r, t in zip(rows.tolist(), ids.tolist()):
        counts[r, t] += 1
        seen[r, t] = True
    assert torch.equal(state.counts, counts) and torch.equal(state.seen, seen)
    state.reset(1, [2])  # a new owner of row 1 starts over
    assert state.counts[1].sum() == 0 and state.seen[1].nonzero().flatten().tolist() == [2]


def test_penalties_match_a_row_by_row_reference() -> None:
    B = 6
    b, state, x = _batch(B), _state(B), torch.randn(B, V) * 3
    got = apply_penalties(x, b, state)
    for i in range(B):
        r = int(b.rows[i])
        c = state.counts[r].float()
        rep = float(b.repetition[i])
        want = torch.where(state.seen[r], torch.where(x[i] > 0, x[i] / rep, x[i] * rep), x[i])
        want = want - float(b.presence[i]) * (c > 0).float() - float(b.frequency[i]) * c
        torch.testing.assert_close(got[i], want)


@pytest.mark.parametrize("name", ["logprobs", "all"])
def test_logprobs_are_the_raw_distribution_s_whatever_the_stages(name: str) -> None:
    B = 4
    f, b, state, mask = FEATURE_SETS[name], _batch(B), _state(B), _mask(B)
    x = torch.randn(B, V)
    s = sample_batch(x, b, state, f, mask if f.mask else None)
    assert s.logprob is not None and s.top_ids is not None and s.top_logprobs is not None
    lp = torch.log_softmax(x, dim=-1)
    top = torch.topk(lp, MAX_TOP_LOGPROBS, dim=-1)
    torch.testing.assert_close(s.logprob, lp.gather(1, s.ids[:, None])[:, 0])
    assert torch.equal(s.top_ids, top.indices)
    torch.testing.assert_close(s.top_logprobs, top.values)
    packed = pack(s, True)  # what the graph copies back: id, logprob, top ids, top logprobs
    assert packed[:, 0].long().tolist() == s.ids.tolist() and torch.equal(packed[:, 2:22].long(), top.indices)


@pytest.mark.parametrize("name", ["mask", "all"])
def test_grammar_masks_bound_every_row(name: str) -> None:
    B = 8
    f, b, state, mask = FEATURE_SETS[name], _batch(B), _state(B), _mask(B)
    for trial in range(5):
        b.step += 1
        ids = sample_batch(torch.randn(B, V), b, state, f, mask).ids.tolist()
        assert all(t % (row + 2) == 0 for row, t in enumerate(ids)), (trial, ids)
    x = torch.randn(B, V)
    kept = torch.isfinite(apply_bitmask(x, mask))
    want = torch.tensor([[t % (row + 2) == 0 for t in range(V)] for row in range(B)])
    assert torch.equal(kept, want)


def test_a_seed_draws_by_seed_and_step_alone() -> None:
    """A row's draw depends on its logits, settings, seed and step, not on its place in the batch or the bucket
    (padding rows beside it)."""
    B = 8
    b, x = _batch(B), torch.randn(B, V)
    full = sample_batch(x, b, features=FEATURE_SETS["sample"]).ids
    for i in range(B):
        one = SamplingBatch(**{k: v[i : i + 1] for k, v in vars(b).items()})
        assert sample_batch(x[i : i + 1], one, features=FEATURE_SETS["sample"]).ids.item() == full[i]
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(1))
    shuffled = SamplingBatch(**{k: v[perm] for k, v in vars(b).items()})
    assert torch.equal(sample_batch(x[perm], shuffled, features=FEATURE_SETS["sample"]).ids, full[perm])
    b.step += 1
    assert not torch.equal(sample_batch(x, b, features=FEATURE_SETS["sample"]).ids, full)  # a new step, new draws


def test_a_captured_sampler_replays_rewritten_static_buffers_as_eager() -> None:
    """The sampler captured once over static buffers; between replays the host rewrites the buffers in place (new
    logits, temperatures, seeds, steps, penalties): every replay gives what the eager sampler gives on the same
    values, the penalty counts included."""
    B = 4
    f = FEATURE_SETS["all"]
    static_b, static_x, static_mask = _batch(B), torch.randn(B, V), _mask(B)
    state, eager_state = _state(B), _state(B)
    graph, out = FakeCapture(keep=lambda: [state.counts, state.seen])(
        lambda: _step(static_x, static_b, state, f, static_mask)
    )
    for k in range(4):
        new_b, new_x = _batch(B, seed=10 + k), torch.randn(B, V)
        for name, t in vars(static_b).items():
            t.copy_(getattr(new_b, name))
        static_x.copy_(new_x)
        graph.replay()
        want = _step(new_x, new_b, eager_state, f, static_mask)
        assert torch.equal(out, want), k
        assert torch.equal(state.counts, eager_state.counts) and torch.equal(state.seen, eager_state.seen)


_REFUSED: dict[str, Callable[[torch.Tensor], object]] = {
    "item": lambda x: x.sum().item(),
    "tolist": lambda x: x.tolist(),
    "if on a tensor": lambda x: bool(x.sum() > 0),
    "cpu": lambda x: x.cpu(),
    "nonzero": lambda x: x.nonzero(),
    "boolean mask": lambda x: x[x > 0],
    "boolean mask assignment": lambda x: x.masked_fill(x > 0, 0).index_put_((x > 1,), torch.zeros(())),
    "unique": lambda x: torch.unique(x),
    "multinomial": lambda x: torch.multinomial(torch.softmax(x, -1), 1),
    "rand": lambda x: torch.rand_like(x),
    "host tensor": lambda x: x + torch.tensor([1.0]),
    "accumulate": lambda x: x.index_put_((torch.zeros(2, dtype=torch.int64),), torch.ones(2, x.shape[1]), True),
}


@pytest.mark.parametrize("what", list(_REFUSED))
def test_the_checker_refuses_what_a_capture_refuses(what: str) -> None:
    x = torch.randn(3, 5)
    with pytest.raises(CaptureBreaker), forbid_capture_breakers():
        _REFUSED[what](x)
    assert x.tolist() and x.sum().item() == x.sum().item()  # every method is back after the block
