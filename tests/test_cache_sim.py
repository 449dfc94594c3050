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
