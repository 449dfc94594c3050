"""How many expert slots ``expert_cache`` asks for (slots, or a fraction of the pool); the engine passes the memory
plan's count (``memory/planner.py``), so None only comes from callers that build a backend without a plan."""

from __future__ import annotations

import logging

from freetoken.memory.planner import CPU_SLOT_FRACTION

log = logging.getLogger(__name__)


def resolve_slots(expert_cache: int | float | None, num_rows: int, expert_bytes: int = 0) -> int:
    """Slot count in [1, num_rows] (None: the planner's CPU default share of the pool). A request above the pool is
    clamped with a warning."""
    if expert_cache is None:
        slots = round(CPU_SLOT_FRACTION * num_rows)
    elif isinstance(expert_cache, float):
        slots = round(expert_cache * num_rows)
    else:
        slots = int(expert_cache)
    if slots > num_rows:
        if expert_cache is not None:  # a budget larger than the pool is no mistake
            log.warning("expert cache of %d slots exceeds the pool's %d experts: clamped", slots, num_rows)
        slots = num_rows
    if slots < 1:
        raise ValueError(f"expert cache of {expert_cache!r} gives {slots} slots; at least one layer's top-k are needed")
    return slots


def check_slots_cover_topk(num_slots: int, top_k: int) -> None:
    """A cache smaller than one layer's top-k cannot hold one token's experts: refuse clearly."""
    if num_slots < top_k:
        raise ValueError(
            f"expert cache has {num_slots} slots, fewer than the {top_k} experts one token routes to in a "
            "layer; raise expert_cache or use the 'cpu' backend"
        )
