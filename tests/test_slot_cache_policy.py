"""The slot cache's plan against plain-Python statements of its policy: the fill quota (q of m misses at a share,
by exhaustive search in exact arithmetic) and LRU with the share, locks aside (random sequences, Hypothesis)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.plan import fill_quota
from slot_cache_cases import CPU, E, L, make_pool, slots_hold_their_experts, step

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.mark.parametrize("m", range(0, 9))
@pytest.mark.parametrize("share", [0.0, 0.1, 0.25, 0.5, 0.74, 1.0])
@pytest.mark.parametrize("available", [0, 1, 3, 8])
@pytest.mark.parametrize("min_fill", [0, 1])
def test_fill_quota(m: int, share: float, available: int, min_fill: int) -> None:
    q = fill_quota(torch.tensor(m), torch.tensor(share), torch.tensor(available), min_fill)
    want = balanced_fills(m, share)
    if m > 0:
        want = max(want, min_fill)
    assert int(q) == min(want, available)


def balanced_fills(m: int, share: float) -> int:
    """Of 0..m fills, the one whose later branch ends first (fill i costs 1/share, a CPU run 1/(1-share);
    ties: fewer fills), by exhaustive search in exact arithmetic."""
    s = Fraction(share).limit_denominator(1000)
    return min(range(m + 1), key=lambda q: (max(q * (1 - s), (m - q) * s), q))


def test_fill_quota_is_not_round_half() -> None:
    # s = 0.38, m = 4: round(1.52) = 2 fills (GPU 2/0.38 = 5.3, CPU 2/0.62 = 3.2); 1 fill ends at 4.8
    assert int(fill_quota(torch.tensor(4), torch.tensor(0.38), torch.tensor(8), 1)) == 1
    assert int(fill_quota(torch.tensor(4), torch.tensor(0.45), torch.tensor(8), 1)) == 2  # GPU 4.4, CPU 3.6: 2
    assert int(fill_quota(torch.tensor(3), torch.tensor(0.5), torch.tensor(8), 1)) == 1  # a tie: fewer fills


class LruModel:
    """Plain-Python statement of the policy the device plan implements."""

    def __init__(self, num_slots: int) -> None:
        self.S = num_slots
        self.eid_of = [-1] * num_slots
        self.stamp = [-1] * num_slots
        self.tick = 0

    def step(self, eids: list[int], share: float, min_fill: int) -> None:
        counts = Counter(eids)
        slot_of = {e: s for s, e in enumerate(self.eid_of) if e >= 0}
        hits = [e for e in counts if e in slot_of]
        misses = [e for e in counts if e not in slot_of]
        m = len(misses)
        q = max(balanced_fills(m, share), min(min_fill, m))
        q = min(q, self.S - len(hits))
        fills = sorted(misses, key=lambda e: (-counts[e], e))[:q]
        hit_slots = {slot_of[e] for e in hits}
        free = sorted((s for s in range(self.S) if s not in hit_slots), key=lambda s: (self.stamp[s], s))
        self.tick += 1
        for e in hits:
            self.stamp[slot_of[e]] = self.tick
        for e, s in zip(fills, free):
            self.eid_of[s] = e
            self.stamp[s] = self.tick


@settings(max_examples=40, deadline=None)
@given(
    num_slots=st.integers(2, 8),
    steps=st.lists(
        st.tuples(
            st.integers(0, L - 1),  # layer
            st.lists(
                st.lists(st.integers(0, E - 1), min_size=2, max_size=2, unique=True), min_size=1, max_size=5
            ),
            st.sampled_from([0.0, 0.3, 0.5, 1.0]),
            st.sampled_from([0, 1]),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_random_sequences_match_model_and_keep_integrity(num_slots: int, steps: list) -> None:
    cache = SlotCache(make_pool(), num_slots, CPU)
    model = LruModel(num_slots)
    for layer, ids, share, min_fill in steps:
        plan = step(cache, layer, ids, share, min_fill)
        eids = [layer * E + i for row in ids for i in row]
        model.step(eids, share, min_fill)
        assert cache.tables.eid_of.tolist()[:num_slots] == model.eid_of
        assert cache.tables.stamp.tolist()[:num_slots] == model.stamp
        # Every route is either on a slot holding its expert or a CPU route naming it.
        eid_of = cache.tables.eid_of.tolist()
        for code, eid in zip(plan.route_code.tolist(), eids):
            assert (code >= 0 and eid_of[code] == eid) or (code < 0 and -1 - code == eid)
        cache.check_integrity()
        slots_hold_their_experts(cache)
