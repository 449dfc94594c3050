"""The budget split: a VRAM budget into expert slots + KV pages + a reserve (pure: no torch; ``planner.py`` plans).

The budget covers what elastic memory can move: the expert-slot cache (``slot_bytes`` each), the KV
pool (``page_bytes`` each) and a reserve left free for a step's activations and graphs (the VRAM
watcher keeps at least the reserve free on the device). The model's other weights are fixed and come
on top. Shrinking takes from the slots first (the host pool serves what they lose), then from the KV
pages; growing gives to the slots up to the whole pool, then to the KV pages (more prefix cache).

The split follows the session (``follow_kv``): while running requests pin most of the KV pool, budget
moves from expert slots to KV pages; when they give pages back, it moves back to the slots. The rule
uses KV occupancy, with a band for hysteresis (the measured LRU hit-rate curves of ``bench/lru_hit.py``
are offline figures of recorded traces; the engine has no live curve to read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from freetoken.errors import FreeTokenError, InputError

GIB = 1 << 30
MIB = 1 << 20
# follow_kv: occupancy of the KV pool by running requests' pages
KV_HIGH = 0.75  # above: grow the KV pool (from the slots) ...
KV_TARGET = 0.5  # ... to this occupancy
KV_LOW = 0.25  # below, and above its base size: give pages back to the slots


class BudgetError(InputError):
    """A VRAM budget the engine cannot run in (the message carries the numbers)."""


class ResizeError(FreeTokenError):
    """A budget that passed the checks, but the machine refused the memory while the caches were re-made: the
    engine is back at its previous split (the message says what was asked, what exists and where it is now)."""


@dataclass(frozen=True)
class Capacity:
    """What the machine has for the resizable caches now: ``free_bytes`` free where they live (device memory, or
    host RAM for the CPU engine) plus ``held_bytes`` that they hold already (a resize gives it back), never more
    than ``total_bytes``."""

    free_bytes: int
    held_bytes: int
    total_bytes: int
    where: str  # e.g. "device memory of cuda:0", "host RAM (the CPU engine's caches live there)"

    @property
    def most_bytes(self) -> int:
        return min(self.total_bytes, self.free_bytes + self.held_bytes)

    def explain(self) -> str:
        return (
            f"{self.where}: {self.free_bytes / GIB:.3f} GiB free + {self.held_bytes / GIB:.3f} GiB the caches hold "
            f"now = {self.most_bytes / GIB:.3f} GiB (of {self.total_bytes / GIB:.3f} GiB in all)"
        )


def check_fits(budget: int, capacity: Capacity) -> None:
    """``BudgetError`` (what was asked, what exists) when ``budget`` bytes exceed what the machine has."""
    if budget > capacity.most_bytes:
        raise BudgetError(f"a VRAM budget of {budget / GIB:.3f} GiB exceeds what this machine has for the caches: "
                          f"{capacity.explain()}")  # fmt: skip


@dataclass(frozen=True)
class MemoryFacts:
    """What one slot and one page cost, and the smallest sizes the engine runs with."""

    slot_bytes: int  # one expert slot (0: the backend has no resizable cache)
    page_bytes: int  # one KV page, every layer's K and V
    min_slots: int  # one layer's top-k: one token's experts
    max_slots: int  # the whole pool
    min_pages: int  # one request of the whole context
    reserve_bytes: int  # left free for activations and graphs
    page_size: int = 16
    context: int = 0  # tokens of the context ``min_pages`` holds

    @property
    def minimum_budget(self) -> int:
        return self.min_slots * self.slot_bytes + self.min_pages * self.page_bytes + self.reserve_bytes

    def explain_minimum(self) -> str:
        shares = {"expert slots": self.min_slots * self.slot_bytes, "KV pages": self.min_pages * self.page_bytes,
                  "reserve": self.reserve_bytes}  # fmt: skip
        largest = max(shares, key=lambda k: shares[k])
        return (
            f"{self.min_slots} expert slots x {self.slot_bytes / MIB:.2f} MiB (one layer's top-k) + "
            f"{self.min_pages} KV pages x {self.page_bytes / MIB:.3f} MiB (one {self.context}-token context) + "
            f"{self.reserve_bytes / GIB:.2f} GiB reserve = {self.minimum_budget / GIB:.3f} GiB; the largest share is "
            f"{largest}, which needs {shares[largest] / GIB:.3f} GiB"
        )


@dataclass(frozen=True)
class MemorySplit:
    budget_bytes: int
    slots: int
    kv_pages: int
    reserve_bytes: int

    def used_bytes(self, facts: MemoryFacts) -> int:
        return self.slots * facts.slot_bytes + self.kv_pages * facts.page_bytes


def parse_budget_gib(value: object) -> int:
    """A budget in GiB (a positive finite number) as bytes, exactly (1e308 GiB too: whether it fits is
    ``check_fits``'s question); anything else is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BudgetError(f"vram_budget must be a number of GiB, got {value!r}")
    gib = float(value)
    if not 0 < gib < math.inf:  # NaN fails this too
        what = "a finite" if gib == math.inf else "a positive"
        raise BudgetError(f"vram_budget must be {what} number of GiB, got {value!r}")
    whole = math.floor(gib)
    return whole * GIB + int((gib - whole) * GIB)


def split_budget(budget: int, facts: MemoryFacts, kv_wanted: int) -> MemorySplit:
    """The split of ``budget`` bytes that keeps ``kv_wanted`` KV pages where it can: the slots take the rest up
    to the whole pool (never fewer than ``min_slots``), and what the slots cannot use goes to KV pages."""
    f = facts
    if budget < f.minimum_budget:
        raise BudgetError(
            f"a VRAM budget of {budget / GIB:.3f} GiB is below the minimum this model needs: {f.explain_minimum()}"
        )
    avail = budget - f.reserve_bytes
    if not f.page_bytes:  # pages that cost nothing (DeepSeek-V4 without compressed layers: its rows live in states)
        slots = min(f.max_slots, avail // f.slot_bytes) if f.slot_bytes else 0
        return MemorySplit(budget, int(slots), max(kv_wanted, f.min_pages), f.reserve_bytes)
    most_kv = (avail - f.min_slots * f.slot_bytes) // f.page_bytes
    kv = min(max(kv_wanted, f.min_pages), most_kv)
    slots = min(f.max_slots, (avail - kv * f.page_bytes) // f.slot_bytes) if f.slot_bytes else 0
    kv = (avail - slots * f.slot_bytes) // f.page_bytes
    return MemorySplit(budget, int(slots), int(kv), f.reserve_bytes)


def follow_kv(total_pages: int, pinned_pages: int, base_pages: int) -> int | None:
    """The KV pages the session wants now, or None for no change. ``pinned_pages``: pages running requests
    hold (not the reclaimable prefix cache); ``base_pages``: the KV size of the last budget set by hand (or at
    start), which the pool returns to when the session gives its pages back."""
    if total_pages <= 0:
        return None
    want = math.ceil(pinned_pages / KV_TARGET)
    if pinned_pages > KV_HIGH * total_pages:
        return max(want, total_pages + 1)
    if pinned_pages < KV_LOW * total_pages and total_pages > base_pages:
        return max(base_pages, want)
    return None
