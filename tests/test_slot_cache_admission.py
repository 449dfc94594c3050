"""The slot cache's admission control: slots used within the last ``protect`` plans are not evicted, recent slots
are victims last (newest first, offload's streaming rule), and only pinned pool rows are filled (``fill_rows``)."""

from __future__ import annotations

import pytest
import torch

from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.plan import FillRule, SlotTables, StepPlan, group_routes, plan_fills
from slot_cache_cases import CPU, make_pool

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


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
