"""How many expert slots: ``expert_cache`` (slots, or a fraction of the pool) or the VRAM budget."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

# expert_cache=None on the CPU (tests, no VRAM to budget): this share of the pool.
CPU_DEFAULT_FRACTION = 0.25
# expert_cache=None on CUDA: this share of the free device memory goes to slots (the rest: KV, activations).
VRAM_SLOT_SHARE = 0.6


def vram_slot_budget(device: torch.device, expert_bytes: int) -> int:
    free, _total = torch.cuda.mem_get_info(device)
    return int(free * VRAM_SLOT_SHARE) // max(expert_bytes, 1)


def resolve_slots(expert_cache: int | float | None, num_rows: int, expert_bytes: int, device: torch.device) -> int:
    """Slot count in [1, num_rows]. A request above the pool is clamped with a warning."""
    if expert_cache is None:
        if device.type == "cuda":
            slots = vram_slot_budget(device, expert_bytes)
        else:
            slots = round(CPU_DEFAULT_FRACTION * num_rows)
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
