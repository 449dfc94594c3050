"""Slot cache: exact slot tables and eviction order on hand-built routing, q, padded copies, integrity; the host API;
a pool larger than RAM refused. (The policy against plain-Python statements of it: test_slot_cache_policy.py;
the Triton plan: test_slot_cache_triton.py; admission control: test_slot_cache_admission.py; resizes:
test_slot_cache_resize.py.)

Pool rows are filled with their eid (every element of row e equals e), so a slot's content names the
expert it holds (``slot_cache_cases.py``).
"""

from __future__ import annotations

import pytest
import torch

from freetoken.experts.host_pool import check_pool_fits
from freetoken.experts.slots.cache import SlotCache
from slot_cache_cases import CPU, make_pool, slots_hold_their_experts, step

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


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


def test_refuses_pool_larger_than_ram() -> None:
    gib = 1 << 30
    check_pool_fits(10 * gib, total_ram=24 * gib)
    with pytest.raises(MemoryError, match="host RAM"):
        check_pool_fits(23 * gib, total_ram=24 * gib)
