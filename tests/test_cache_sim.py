"""The cache simulator's counts and its modelled miss time (``bench/cache_sim.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.bench.cache_sim import simulate


@pytest.fixture
def trace() -> np.ndarray:
    rng = np.random.default_rng(0)
    hot = rng.integers(0, 16, size=(300, 3, 4))  # a skewed trace: most routes among 16 of 32 experts
    cold = rng.integers(0, 32, size=(300, 3, 4))
    t = np.where(rng.random((300, 3, 4)) < 0.8, hot, cold)
    t[:, :, 0] = 31  # one distinct expert per route at least ...
    t[:, :, 1] = 30
    return t.astype(np.uint8)


def test_offload_share_models_copy_time_only(trace: np.ndarray) -> None:
    gb = 0.01
    r = simulate(trace, 0.25, 1, 1.0, 1, 100, 20, recent_last=True, bw=(50.0, 25.0, gb))
    assert r.cpu_runs == 0 and r.fills == r.misses > 0
    assert r.whole_s == pytest.approx(r.fills * gb / 50.0)
    assert r.split_s == pytest.approx(r.misses * gb / 75.0)


def test_split_floor_below_whole_experts(trace: np.ndarray) -> None:
    r = simulate(trace, 0.25, 1, 0.6, 1, 100, 20, recent_last=True, bw=(50.0, 25.0, 0.01))
    assert r.cpu_runs > 0 and r.fills > 0
    assert r.split_s < r.whole_s  # whole experts per branch cannot balance every layer exactly
    # each layer step's max is at least its exact split, and the sum of maxima at least the busier branch
    assert r.whole_s >= max(r.fills * 0.01 / 50.0, r.cpu_runs * 0.01 / 25.0) - 1e-12


def test_without_bandwidths_no_model(trace: np.ndarray) -> None:
    r = simulate(trace, 0.25, 1, 0.6, 1, 50, 10, recent_last=True)
    assert r.whole_s == 0.0 and r.split_s == 0.0 and 0.0 < r.hit_rate < 1.0


def test_background_fills_keep_offloads_cache_contents(trace: np.ndarray) -> None:
    """Filling every CPU-run expert in the background leaves the cache as offload's: the same misses, fewer of
    them on the critical path; their copy time counts beyond the idle gap."""
    off = simulate(trace, 0.25, 1, 1.0, 1, 100, 20, recent_last=True)
    hyb = simulate(trace, 0.25, 1, 0.6, 1, 100, 20, recent_last=True)
    bg = simulate(trace, 0.25, 1, 0.6, 1, 100, 20, recent_last=True, background=8)
    assert bg.misses == off.misses != hyb.misses
    assert bg.background == bg.cpu_runs > 0 and bg.fills < off.fills
    gb = 0.01
    free = simulate(trace, 0.25, 1, 0.6, 1, 100, 20, True, (50.0, 25.0, gb), background=8, gap_s=1.0)
    paid = simulate(trace, 0.25, 1, 0.6, 1, 100, 20, True, (50.0, 25.0, gb), background=8)
    assert paid.whole_s == pytest.approx(free.whole_s + paid.background * gb / 50.0)


def test_recent_admission_fills_the_last_routed_miss_first() -> None:
    """Two misses, one fill: the engine's order takes the lower eid; 'recent' takes the one routed last step."""
    import torch

    from freetoken.experts.slot_plan import SlotTables, group_routes, plan_fills

    N, S = 8, 4
    t = SlotTables(torch.full((N + 1,), -1), torch.full((S + 1,), -1), torch.full((S + 1,), -1),
                   torch.zeros(S + 1, dtype=torch.bool), torch.zeros((), dtype=torch.long))  # fmt: skip
    g = group_routes(torch.tensor([2, 5]), N)
    share = torch.tensor(0.5)
    plain = plan_fills(t, g, g.valid, share, 1)
    assert plain.copy_src[: int(plain.copy_count)].tolist() == [2]
    t2 = SlotTables(torch.full((N + 1,), -1), torch.full((S + 1,), -1), torch.full((S + 1,), -1),
                    torch.zeros(S + 1, dtype=torch.bool), torch.zeros((), dtype=torch.long))  # fmt: skip
    last = torch.zeros(N + 1, dtype=torch.long)
    last[5] = 7  # eid 5 was routed recently, eid 2 never
    recent = plan_fills(t2, g, g.valid, share, 1, priority=last[g.eid.clamp(max=N)])
    assert recent.copy_src[: int(recent.copy_count)].tolist() == [5]
    with pytest.raises(ValueError, match="admission"):
        simulate(np.zeros((4, 1, 2), dtype=np.uint8), 0.5, 1, 0.5, 0, 2, 1, admission="lfu")


def test_tail_deferred_balances_an_overloaded_gpu_side() -> None:
    """Copies twice as fast as the CPU (share 2/3): when the whole fills overload the GPU side, the last fill keeps
    only m * share experts' worth critical; its tail drains in the layer's PCIe slack or stays as backlog, first
    in line before the next layer's fills."""
    from freetoken.bench.cache_sim import tail_deferred

    bw = (50.0, 25.0, 0.01)  # B_P', B_H', GB per expert: share 2/3
    t, backlog = tail_deferred(2.0, 3, True, 0.0, bw, 0.0)  # 2 of 3 experts on the GPU: already balanced
    assert t == pytest.approx(2 * 0.01 / 50.0) and backlog == 0.0
    t, backlog = tail_deferred(2.0, 2, True, 0.0, bw, 0.0)  # both misses filled: the CPU would idle
    crit = 2 * 50.0 / 75.0  # m * share: experts' worth on the critical path
    assert t == pytest.approx(max(crit * 0.01 / 50.0, (2 - crit) * 0.01 / 25.0))
    assert backlog == pytest.approx((2 - crit) * 0.01)  # the tail had no slack: all of it is backlog
    t2, left = tail_deferred(1.0, 2, True, backlog, bw, 0.0)  # the backlog goes first: the fill ends later
    assert t2 > 0.01 / 50.0 and left == 0.0
    drained, _ = tail_deferred(1.0, 2, True, backlog, bw, 1.0)  # a long serial gap drains it for free
    assert drained == pytest.approx(max(0.01 / 50.0, 0.01 / 25.0))
    whole, none = tail_deferred(2.0, 2, False, 0.0, bw, 0.0)  # no whole fill to split: as plain hybrid
    assert whole == pytest.approx(2 * 0.01 / 50.0) and none == 0.0


def test_split_fills_keep_the_cache_and_cut_the_modelled_time(trace: np.ndarray) -> None:
    bw = (50.0, 25.0, 0.01)
    plain = simulate(trace, 0.25, 1, 0.6, 1, 100, 20, True, bw)
    split = simulate(trace, 0.25, 1, 0.6, 1, 100, 20, True, bw, split_fill=True, gap_s=1e-4)
    assert (split.misses, split.fills, split.cpu_runs) == (plain.misses, plain.fills, plain.cpu_runs)
    assert plain.split_s <= split.whole_s < plain.whole_s
