"""The slot cache resized: a shrink keeps locked experts then the newest, a grow brings back what a shrink let go
(most recent first, in their LRU order), and neither takes a slot from a resident expert."""

from __future__ import annotations

import pytest
import torch

from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.plan import FillRule
from slot_cache_cases import CPU, E, L, make_pool, slots_hold_their_experts, step

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def lru_order(cache: SlotCache) -> list[int]:
    """Resident eids, the most recently used first (victims go oldest stamp, then lowest slot, first)."""
    t = cache.tables
    S = cache.num_slots
    pairs = [(st, s, e) for s, (e, st) in enumerate(zip(t.eid_of[:S].tolist(), t.stamp[:S].tolist())) if e >= 0]
    return [e for _, _, e in sorted(pairs, reverse=True)]


def test_resize_keeps_locked_then_newest() -> None:
    cache = SlotCache(make_pool(), 4, CPU)
    step(cache, 0, [[0, 1]])  # tick 1: eids 0, 1
    step(cache, 0, [[2, 3]])  # tick 2: eids 2, 3
    step(cache, 0, [[0]])  # tick 3: eid 0 again
    cache.lock([1])
    cache.resize(2)  # keeps locked eid 1, then the newest: eid 0 (slots in eid order)
    assert cache.resident() == {0: 0, 1: 1}
    assert cache.tables.locked.tolist() == [False, True, False]
    slots_hold_their_experts(cache)
    cache.check_integrity()
    cache.resize(5)  # grow: everything stays, and what the shrink let go comes back (as the oldest residents)
    assert cache.resident() == {0: 0, 1: 1, 2: 2, 3: 3} and cache.free() == 1
    order = lru_order(cache)  # eid 1 (tick 1) older than eid 0; then the let-go eids 2 and 3 (both tick 2)
    assert order[:2] == [0, 1] and set(order[2:]) == {2, 3}
    slots_hold_their_experts(cache)
    step(cache, 1, [[0, 1]])  # eids 4, 5: the free slot 4, then the oldest victim (brought back, least recent)
    assert set(cache.resident()) == {0, 1, 2, 3, 4, 5} - {order[-1]} and cache.resident()[4] == 4
    slots_hold_their_experts(cache)
    cache.check_integrity()
    with pytest.raises(ValueError):
        cache.lock([0])
        cache.resize(1)  # two locked experts cannot fit one slot


def _warm(cache: SlotCache, order: list[int]) -> None:
    """Route ``order``'s eids one per plan, so the last is the most recently used."""
    for e in order:
        step(cache, e // E, [[e % E]])


def test_a_grow_refills_the_experts_a_shrink_let_go_most_recent_first() -> None:
    """The whole pool resident, shrunk to 2 slots, then grown: the cache holds the pre-shrink experts again, the
    most recently used first, with their LRU order (misses evict the least recently used of them first)."""
    N = L * E
    cache = SlotCache(make_pool(), N, CPU)
    before = [5, 2, 7, 0, 3, 6, 1, 4]  # use order: eid 4 is the newest
    _warm(cache, before)
    mru = before[::-1]
    cache.resize(2)
    assert lru_order(cache) == mru[:2]
    step(cache, 0, [[2]])  # decode at the small size: eid 2 fills, evicting eid 1 (it comes back on the grow)
    cache.resize(6)  # not all fit: the newest of what was let go come back
    assert lru_order(cache) == [2, *mru[:2], 6, 3, 0]  # the small cache's residents, then the let-go, newest first
    slots_hold_their_experts(cache)
    cache.check_integrity()
    cache.resize(N)  # the rest come back too, below every resident
    assert lru_order(cache) == [2, *mru[:2], 6, 3, 0, 7, 5]
    slots_hold_their_experts(cache)
    cache.check_integrity()
    plan = step(cache, 0, [[0, 1]])  # every expert resident: only hits, no copy
    assert int(plan.copy_count) == 0 and int(plan.num_hits) == 2


@pytest.mark.parametrize("protect", [0, L])
def test_misses_after_a_grow_evict_the_least_recent_brought_back_expert(protect: int) -> None:
    """Brought back into fewer slots than the pool: each miss takes the least recently used of them (plain LRU
    and offload's streaming rule alike), never the hottest one (which would miss again at once)."""
    cache = SlotCache(make_pool(), 8, CPU)
    before = [5, 2, 7, 0, 3, 6, 1, 4]
    _warm(cache, before)
    cache.resize(2)
    cache.resize(6)  # eids 4 1 6 3 0 7, newest first; 2 and 5 absent
    rule = FillRule(min_fill=1, protect=protect, recent_last=True)
    evicted = []
    for e in (2, 5):
        held = set(cache.resident())
        groups = cache.group(e // E, torch.tensor([[e % E]]))
        cache.copy(cache.plan(groups, groups.valid, torch.tensor(1.0), rule))
        evicted += held - set(cache.resident())
    assert evicted == [7, 0]
    slots_hold_their_experts(cache)
    cache.check_integrity()


def test_a_shrink_right_after_a_grow_keeps_the_most_recent() -> None:
    """Another shrink comes before a step ran on the regrown cache: it keeps the newest residents, and the
    let-go list still holds everything else, newest first."""
    cache = SlotCache(make_pool(), 8, CPU)
    before = [5, 2, 7, 0, 3, 6, 1, 4]
    _warm(cache, before)
    mru = before[::-1]
    cache.resize(2)
    cache.resize(7)
    cache.resize(3)
    assert lru_order(cache) == mru[:3]
    cache.check_integrity()
    cache.resize(8)
    assert lru_order(cache) == mru
    slots_hold_their_experts(cache)
    cache.check_integrity()


def test_a_refill_never_takes_a_slot_from_a_resident_expert() -> None:
    """A grow only fills the new slots: every expert resident before stays, in its LRU place (locked ones too)."""
    cache = SlotCache(make_pool(), 8, CPU)
    _warm(cache, list(range(8)))
    cache.resize(3)
    _warm(cache, [1, 0])  # eid 1 fills into the LRU slot; eid 0 too
    cache.lock([0])
    kept = lru_order(cache)
    cache.resize(5)
    assert lru_order(cache)[:3] == kept and cache.tables.locked[cache.lookup([0])].all()
    slots_hold_their_experts(cache)
    cache.check_integrity()
