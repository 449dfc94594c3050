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
