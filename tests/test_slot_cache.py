"""Slot cache: exact slot tables and eviction order on hand-built routing, q, padded copies, integrity.

Pool rows are filled with their eid (every element of row e equals e), so a slot's content names the
expert it holds.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from devices import TRITON_INTERPRETER
from freetoken.experts.base import ExpertBanks
from freetoken.experts.host_pool import HostExpertPool, check_pool_fits
from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.plan import FillRule, SlotTables, StepPlan, fill_quota, group_routes, plan_fills

L, E, D, I = 2, 4, 4, 2  # N = 8 pool rows
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def make_pool(num_layers: int = L, num_experts: int = E) -> HostExpertPool:
    n = num_layers * num_experts
    ids = torch.arange(n, dtype=torch.float32)
    banks = ExpertBanks(
        gate_up=ids[:, None, None].expand(n, 2 * I, D).clone(),
        down=(ids[:, None, None] + 0.5).expand(n, D, I).clone(),
        num_layers=num_layers,
        num_experts=num_experts,
    )
    return HostExpertPool(banks, pin=False)


def step(
    cache: SlotCache, layer: int, ids: list[list[int]], share: float = 1.0, min_fill: int = 1
) -> StepPlan:
    groups = cache.group(layer, torch.tensor(ids))
    plan = cache.plan(groups, groups.valid, torch.tensor(share), FillRule(min_fill))
    cache.copy(plan)
    return plan


def slots_hold_their_experts(cache: SlotCache) -> None:
    for eid, slot in cache.resident().items():
        assert torch.equal(cache.slot_gate_up[slot], cache.pool.gate_up[eid])
        assert torch.equal(cache.slot_down[slot], cache.pool.down[eid])


def test_fills_by_route_count_into_free_slots_in_order() -> None:
    cache = SlotCache(make_pool(), 3, CPU)
    plan = step(cache, 0, [[0, 1], [1, 2]])  # eid 1 is routed twice
    assert plan.copy_src.tolist() == [1, 0, 2]
    assert plan.copy_dst.tolist() == [0, 1, 2]
    assert int(plan.copy_count) == 3 and int(plan.num_misses) == 3 and int(plan.num_hits) == 0
    assert plan.route_code.tolist() == [1, 0, 0, 2]
    assert cache.resident() == {1: 0, 0: 1, 2: 2}
    assert cache.tables.stamp.tolist() == [1, 1, 1, -1]
    slots_hold_their_experts(cache)
    cache.check_integrity()


def test_lru_victims_and_hits_protected() -> None:
    cache = SlotCache(make_pool(), 3, CPU)
    step(cache, 0, [[0, 1], [1, 2]])  # slots: 1->0, 0->1, 2->2, all stamp 1
    plan = step(cache, 1, [[0, 3]])  # eids 4, 7: evict the two oldest (ties: lower slot)
    assert plan.copy_src.tolist() == [4, 7] and plan.copy_dst.tolist() == [0, 1]
    assert cache.resident() == {4: 0, 7: 1, 2: 2}
    assert cache.lookup([1, 0]).tolist() == [-1, -1]
    # eid 2 is the oldest (stamp 1) but is hit by this step: slot 2 must not be the victim.
    plan = step(cache, 0, [[2, 0]])
    assert int(plan.num_hits) == 1 and int(plan.num_misses) == 1
    assert plan.copy_src.tolist() == [0, 0] and plan.copy_dst.tolist() == [0, 3]  # 2nd entry: padding
    assert int(plan.copy_count) == 1
    assert plan.route_code.tolist() == [2, 0]
    assert cache.resident() == {0: 0, 7: 1, 2: 2}
    assert cache.tables.stamp.tolist()[:3] == [3, 2, 3]
    slots_hold_their_experts(cache)
    cache.check_integrity()


def test_share_splits_misses_and_cpu_routes_get_negative_codes() -> None:
    cache = SlotCache(make_pool(), 4, CPU)
    # 4 misses, share 0.5 -> q = 2: the two most-routed (eid 3 x4, eid 1 x2) are filled.
    plan = step(cache, 0, [[3, 1], [3, 1], [3, 0], [3, 2]], share=0.5)
    assert int(plan.copy_count) == 2
    assert plan.copy_src.tolist()[:2] == [3, 1]
    assert cache.resident() == {3: 0, 1: 1}
    assert plan.route_code.tolist() == [0, 1, 0, 1, 0, -1 - 0, 0, -1 - 2]


def test_frozen_residency_fills_nothing() -> None:
    cache = SlotCache(make_pool(), 4, CPU)
    cache.insert([5, 6])
    plan = step(cache, 1, [[1, 2], [0, 1]], share=0.0, min_fill=0)  # eids 5, 6 hit; 4 misses
    assert int(plan.copy_count) == 0 and int(plan.num_hits) == 2 and int(plan.num_misses) == 1
    assert plan.copy_dst.tolist() == [4, 4, 4, 4]  # all padding, into the scratch slot
    assert plan.route_code.tolist() == [0, 1, -1 - 4, 0]
    assert cache.resident() == {5: 0, 6: 1}


def test_quota_never_exceeds_unread_slots() -> None:
    cache = SlotCache(make_pool(), 2, CPU)
    step(cache, 0, [[0, 1]])
    plan = step(cache, 0, [[0, 1], [2, 3]])  # both slots hit: no slot may be filled
    assert int(plan.num_hits) == 2 and int(plan.num_misses) == 2 and int(plan.copy_count) == 0
    assert plan.route_code.tolist() == [0, 1, -1 - 2, -1 - 3]
    assert cache.resident() == {0: 0, 1: 1}


def test_locked_slots_are_never_victims() -> None:
    cache = SlotCache(make_pool(), 2, CPU)
    cache.insert([0])
    cache.lock([0])
    step(cache, 0, [[1, 2]], share=1.0)  # only one unlocked slot: q = 1, eid 1 (lower id) wins
    assert cache.resident() == {0: 0, 1: 1}
    step(cache, 0, [[3]])
    assert cache.resident() == {0: 0, 3: 1}
    cache.unlock([0])
    step(cache, 1, [[0]])  # eid 4 now evicts the older eid 0
    assert cache.resident() == {4: 0, 3: 1}
    cache.check_integrity()


def test_host_api_insert_evict_lookup_size() -> None:
    cache = SlotCache(make_pool(), 3, CPU)
    assert cache.insert([6, 2]).tolist() == [1, 0]  # eid 2 (lower) is filled first
    assert cache.size() == 2 and cache.free() == 1 and cache.total == 3
    cache.evict([6, 5])  # 5 is absent: ignored
    assert cache.lookup([6, 2]).tolist() == [-1, 0]
    assert cache.size() == 1
    with pytest.raises(ValueError):
        cache.insert([1, 3, 4, 5])
    with pytest.raises(KeyError):
        cache.lock([7])
    slots_hold_their_experts(cache)
    cache.check_integrity()


def test_padded_copies_only_touch_the_scratch_slot() -> None:
    cache = SlotCache(make_pool(), 4, CPU)
    step(cache, 0, [[0, 1], [2, 3]])
    before = cache.slot_gate_up[:4].clone()
    plan = step(cache, 1, [[0, 1], [0, 1]], share=0.5)  # m = 2 -> q = 1, one padded entry
    assert plan.copy_dst.tolist() == [0, 4, 4, 4]  # Kv = min(T*k, S) = 4 entries
    assert torch.equal(cache.slot_gate_up[1:4], before[1:4])
    assert torch.equal(cache.slot_gate_up[0], cache.pool.gate_up[4])
    cache.check_integrity()


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


def test_refuses_pool_larger_than_ram() -> None:
    gib = 1 << 30
    check_pool_fits(10 * gib, total_ram=24 * gib)
    with pytest.raises(MemoryError, match="host RAM"):
        check_pool_fits(23 * gib, total_ram=24 * gib)


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


def _tables(num_rows: int, num_slots: int) -> SlotTables:
    return SlotTables.empty(num_rows, num_slots)


@TRITON_INTERPRETER
@pytest.mark.parametrize("num_slots", [2, 5, 37, 700])
def test_fused_triton_plan_equals_torch_plan(num_slots: int) -> None:
    """The one-launch Triton plan gives bit-identical tables, outputs and counters (run in Triton's interpreter)."""
    from freetoken.experts.slots.counters import DeviceCounters
    from freetoken.experts.slots.plan_triton import plan_step_triton

    ca, cb = DeviceCounters(CPU, 3), DeviceCounters(CPU, 3)

    layers, experts, k = 3, 16, 2
    a, b = _tables(layers * experts, num_slots), _tables(layers * experts, num_slots)
    g = torch.Generator().manual_seed(num_slots)
    for step_i in range(25):
        T = int(torch.randint(1, 17, (1,), generator=g))
        layer = step_i % layers
        ids = torch.rand(T, experts, generator=g).argsort(dim=1)[:, :k]
        share = torch.tensor(float(torch.rand((), generator=g)))
        min_fill = step_i % 2
        if step_i == 10 and num_slots > 3:  # lock a resident expert for a while
            lockme = int(a.eid_of[0])
            if lockme >= 0:
                a.locked[0] = b.locked[0] = True
        protect = (0, 1, layers)[step_i % 3]
        recent_last = step_i % 4 >= 2
        groups = group_routes(ids.reshape(-1) + layer * experts, layers * experts)
        rule = FillRule(min_fill, protect, recent_last, fill_rows=(None, experts + 3)[step_i % 5 == 1])
        want = plan_fills(a, groups, groups.valid, share, rule)
        off = layer * experts
        got = plan_step_triton(b, ids, off, share, rule, cb.vector, True, cb.per_layer[layer])
        ca.add_step(layer, want.num_hits, want.num_misses, want.copy_count, want.num_misses - want.copy_count)
        assert got.counted and torch.equal(cb.vector, ca.vector), (cb.vector, ca.vector)
        assert torch.equal(cb.per_layer, ca.per_layer), (cb.per_layer, ca.per_layer)
        for f in ("order", "route_group", "start", "count", "eid", "valid", "n_groups"):
            assert torch.equal(getattr(got.groups, f), getattr(want.groups, f)), f
        for f in ("slot", "hit", "fill", "miss", "route_code", "copy_src", "copy_dst", "copy_count"):
            assert torch.equal(getattr(got, f), getattr(want, f)), f
        assert int(got.num_hits) == int(want.num_hits) and int(got.num_misses) == int(want.num_misses)
        for f in ("slot_of", "eid_of", "stamp", "tick"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_protect_keeps_the_last_steps_experts() -> None:
    """Admission control: slots used within the last `protect` plans are not evicted (the misses that
    would need them stay unfilled, for the CPU), and free slots are always fillable."""
    cache = SlotCache(make_pool(), 3, CPU)
    plan = step_protect(cache, 0, [[0, 1]], protect=2)  # tick 1: free slots fill normally
    assert int(plan.copy_count) == 2
    plan = step_protect(cache, 1, [[0, 1]], protect=2)  # tick 2: one free slot left, eids 4, 5 miss
    assert int(plan.copy_count) == 1 and cache.resident() == {0: 0, 1: 1, 4: 2}
    plan = step_protect(cache, 0, [[2, 3]], protect=2)  # tick 3: every slot used in the last 2 plans
    assert int(plan.copy_count) == 0 and plan.route_code.tolist() == [-1 - 2, -1 - 3]
    plan = step_protect(cache, 0, [[2, 3]], protect=1)  # only the last plan (which used no slot) counts
    assert int(plan.copy_count) == 2 and cache.resident() == {2: 0, 3: 1, 4: 2}
    cache.check_integrity()


def step_protect(
    cache: SlotCache, layer: int, ids: list[list[int]], protect: int, recent_last: bool = False
) -> StepPlan:
    groups = cache.group(layer, torch.tensor(ids))
    plan = cache.plan(groups, groups.valid, torch.tensor(1.0), FillRule(1, protect, recent_last))
    cache.copy(plan)
    return plan


@pytest.mark.parametrize("recent_last", [False, True])
def test_recent_slots_are_victims_last_newest_first(recent_last: bool) -> None:
    """Offload's policy: older slots first (LRU), then the recent ones newest first (streaming)."""
    cache = SlotCache(make_pool(), 3, CPU)
    step_protect(cache, 0, [[0, 1]], 2, recent_last)  # eids 0, 1 -> slots 0, 1 (stamp 1)
    step_protect(cache, 1, [[0, 1]], 2, recent_last)  # eids 4, 5: free slot 2 first, then (last) slot 0
    assert cache.resident() == ({5: 0, 1: 1, 4: 2} if recent_last else {0: 0, 1: 1, 4: 2})
    plan = step_protect(cache, 0, [[2, 3]], 2, recent_last)  # every slot is recent now
    if recent_last:  # newest first: slots 0 and 2 (stamp 2); the older eid 1 stays
        assert plan.copy_dst.tolist() == [0, 2] and cache.resident() == {2: 0, 1: 1, 3: 2}
    else:  # recent slots are never victims: both misses stay unfilled
        assert int(plan.copy_count) == 0 and cache.resident() == {0: 0, 1: 1, 4: 2}
    cache.check_integrity()


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


def test_fill_rows_keeps_unpinned_experts_out_of_the_cache() -> None:
    """A pool pinned up to row 10: misses of eids >= 10 are never filled (they run on the CPU), the others
    fill as the share says."""
    t = SlotTables.empty(16, 8)
    rule = FillRule(min_fill=1, fill_rows=10)
    for step_i in range(6):
        ids = torch.tensor([[step_i, 8 + step_i], [9, 15]])
        groups = group_routes(ids.reshape(-1), 16)
        plan = plan_fills(t, groups, groups.valid, torch.tensor(1.0), rule)
        filled = plan.copy_src[: int(plan.copy_count)].tolist()
        assert all(e < 10 for e in filled)
        assert step_i == 0 or 9 not in filled  # eid 9 filled once, then it hits
        codes = plan.route_code.tolist()
        assert codes[3] == -1 - 15  # eid 15 always runs on the CPU
    resident = [e for e in t.eid_of.tolist() if e >= 0]
    assert resident and max(resident) < 10
