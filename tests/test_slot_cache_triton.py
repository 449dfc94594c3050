"""The one-launch Triton plan of the slot cache against the torch plan (Triton's interpreter): bit-identical tables,
outputs and counters."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.experts.slots.plan import FillRule, SlotTables, group_routes, plan_fills
from slot_cache_cases import CPU

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


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
