"""The slot cache's tests' pool and steps. Pool rows are filled with their eid (every element of row e equals e), so a
slot's content names the expert it holds."""

from __future__ import annotations

import torch

from freetoken.experts.base import ExpertBanks
from freetoken.experts.host_pool import HostExpertPool
from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.plan import FillRule, StepPlan

L, E, D, I = 2, 4, 4, 2  # N = 8 pool rows
CPU = torch.device("cpu")


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
