"""Elastic memory: resizes the expert-slot cache and the KV pool to a budget, at a safe point between steps.

Only the engine thread calls this, between steps (``AsyncLLM`` runs commands there; ``LLMEngine.step``
calls ``follow`` after its step). A resize: waits for the device, drops the step graphs (they captured
the old tensors' addresses; the buckets are captured again on later steps), shrinks before it grows (so a
grow finds the memory a shrink gave back), and returns freed memory to the device. Slots shrink LRU first
(``SlotCache.resize``); KV pages shrink by evicting LRU prefix-cache pages first, then by preempting the
newest running requests (``Scheduler.resize_kv``); the radix tree keeps every page that survives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from freetoken.engine.vram_watch import STREAK_S, watch_decision
from freetoken.hardware.device_memory import uses_driver_memory
from freetoken.memory.budget import (
    GIB,
    Capacity,
    MemorySplit,
    ResizeError,
    check_fits,
    follow_kv,
)
from freetoken.memory.capacity import machine_capacity
from freetoken.memory.planner import MemoryPlan, resize_plan

if TYPE_CHECKING:
    from freetoken.cache.kv_pool import KVPool
    from freetoken.engine.scheduler import Scheduler
    from freetoken.experts.base import ExpertBackend
    from freetoken.runner.step_graph import StepGraphs

log = logging.getLogger(__name__)
HISTORY = 256


@dataclass(frozen=True)
class ResizeRecord:
    at: float  # unix time
    source: str  # start | api | watcher | session
    reason: str
    budget_gib: float
    slots_before: int
    slots_after: int
    kv_pages_before: int
    kv_pages_after: int
    preempted: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def as_built(plan: MemoryPlan, backend: ExpertBackend | None, kv: KVPool) -> MemoryPlan:
    """The start plan with the units and counts of the caches the engine built (a backend may have fallen back to
    one without slots, e.g. ``cpu`` where the pool could not be pinned)."""
    lo, hi = backend.slot_range if backend is not None else (0, 0)
    slot_bytes = backend.slot_bytes if backend is not None else 0
    sizes = replace(plan.sizes, slot_bytes=slot_bytes, min_slots=lo, max_slots=hi, page_bytes=kv.page_bytes)
    slots = backend.num_slots if backend is not None else 0
    return replace(plan, sizes=sizes, slots=slots, kv_pages=kv.num_pages)


class ElasticMemory:
    def __init__(
        self,
        plan: MemoryPlan,
        scheduler: Scheduler,
        backend: ExpertBackend | None,
        graphs: StepGraphs | None,
        device: torch.device,
        follow: bool,
        capacity: Callable[[int], Capacity] | None = None,
    ) -> None:
        """``plan``: the start's (``memory.planner.plan``); every resize plans again with the same function
        (``resize_plan``). ``capacity(held_bytes)``: what the machine has for the caches (``capacity.machine_capacity``;
        tests pass their own)."""
        self.plan = as_built(plan, backend, scheduler.kv)
        self.facts = self.plan.facts(scheduler.kv.pages_for(plan.context))
        self.capacity = capacity or (lambda held: machine_capacity(device, held))
        self.scheduler, self.backend, self.graphs, self.device = scheduler, backend, graphs, device
        self.follow_session = follow
        kv = scheduler.kv.num_pages
        self.split = self.plan.split
        budget = self.split.budget_bytes
        self.target_bytes = budget  # the budget set by hand (or at start): the watcher grows back up to it
        self.base_kv = kv  # KV pages of that budget: the session's split returns to it
        scheduler.kv_ceiling = kv
        self.last: ResizeRecord | None = None
        self.num_resizes = 0
        self.history: list[ResizeRecord] = []  # the last HISTORY resizes (benchmarks read them)
        self.restore_to: MemorySplit | None = None  # the split before a failed resize the machine refused to put back
        self._streak, self._last_shrink = 0, -1e9  # the watcher's shrinks in a row (vram_watch.STREAK_S)

    @property
    def num_slots(self) -> int:
        return self.backend.num_slots if self.backend is not None else 0

    # ---- what asks for a resize -----------------------------------------------------------------------
    def set_budget(
        self, budget_bytes: int, reason: str, source: str = "api", kv_wanted: int | None = None
    ) -> ResizeRecord:
        """A budget set by hand (or at start): the slots take the change first (the KV pages stay as they are,
        or ``kv_wanted``, where they fit). Refused (``BudgetError``, with the numbers) below the minimum or above
        what the machine has (``check_fits``), before anything changes. All or nothing: where the machine refuses
        the memory meanwhile, ``ResizeError``, the caches back at their sizes before."""
        want = self.scheduler.kv.num_pages if kv_wanted is None else kv_wanted
        split = self._planned(budget_bytes, want)
        check_fits(budget_bytes, self.capacity(self.held_bytes))
        was = self.target_bytes, self.base_kv
        self.target_bytes, self.base_kv = budget_bytes, split.kv_pages
        try:
            return self.apply(split, reason, source, exact=True)
        except ResizeError:
            self.target_bytes, self.base_kv = was
            self.scheduler.kv_ceiling = self.base_kv
            raise

    def on_free_memory(self, free_bytes: int) -> ResizeRecord | None:
        """The VRAM watcher's reading: shrink when the device's free memory fell under the reserve, grow
        back (hysteresis) towards the budget set by hand when it freed."""
        f = self.facts
        streak = self._streak + 1 if time.monotonic() - self._last_shrink < STREAK_S else 0
        decision = watch_decision(free_bytes, f.reserve_bytes, self.split.budget_bytes, self.target_bytes,
                                  f.minimum_budget, streak)  # fmt: skip
        if decision is None:
            return None
        budget, why = decision
        shrink = budget < self.split.budget_bytes
        split = self._planned(budget, self.split.kv_pages)
        if shrink and split.kv_pages > self.split.kv_pages:
            # the slots took the shrink and left a few pages' bytes over: the pool stays (a grow would re-make it,
            # and free it for a moment, while another program is taking memory)
            split = MemorySplit(budget, split.slots, self.split.kv_pages, split.reserve_bytes)
        rec = self.apply(split, why, "watcher")
        if shrink:  # the streak counts from the end of the resize
            self._streak, self._last_shrink = streak, time.monotonic()
        return rec

    def follow(self) -> ResizeRecord | None:
        """The split follows the session (``memory.follow_kv``); a no-op unless it moves something."""
        split = self._follow_split()
        if split is None:
            return None
        pinned = self.scheduler.pages.num_pinned
        why = f"running requests hold {pinned} of {self.scheduler.kv.num_pages} KV pages"
        return self.apply(split, why, "session")

    def wants_follow(self) -> bool:
        """Whether ``follow`` would resize now (the engine then reads its overlapped step first)."""
        return self._follow_split() is not None

    def _follow_split(self) -> MemorySplit | None:
        if not self.follow_session or self.split.budget_bytes < self.facts.minimum_budget:
            # below the minimum: the device cut the caches (``apply``) or granted only the fewest again (``resume``,
            # which may run inside a step): no plan moves bytes within that; the watcher's grow plans again
            return None
        kv = self.scheduler.kv
        want = follow_kv(kv.num_pages, self.scheduler.pages.num_pinned, self.base_kv)
        if want is None:
            return None
        split = self._planned(self.split.budget_bytes, want)
        if split.kv_pages == kv.num_pages:
            return None  # the slots cannot give more (or the pool is where it should be)
        return split

    def _planned(self, budget: int, kv_wanted: int) -> MemorySplit:
        """The planner's split of ``budget`` keeping ``kv_wanted`` KV pages where it can (``BudgetError`` below the
        minimum)."""
        return resize_plan(self.plan, budget, kv_wanted).split

    # ---- doing it -------------------------------------------------------------------------------------
    def apply(self, split: MemorySplit, reason: str, source: str, exact: bool = False) -> ResizeRecord:
        """The caches to ``split``. Where the device refuses a size, each cache falls back (smaller, or waiting for
        device memory: every request keeps its place); any other failure puts them back at their sizes before.
        ``exact`` (a budget set by hand): all or nothing, anything but ``split`` puts them back and raises
        ``ResizeError``."""
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.waiting:
            self.resume()
        slots0, kv0, before = self.num_slots, self.kv_pages, self.split
        if (split.slots != slots0 or split.kv_pages != kv0) and self.graphs is not None:
            self.graphs.clear()
        preempted = 0
        failure: Exception | None = None
        if not self.waiting:  # (still waiting: the device refused the fewest again; nothing else can change now)
            try:
                preempted = self._resize(split, slots0, kv0)
            except torch.OutOfMemoryError as exc:
                failure = exc
                log.warning("memory %s: %s; the engine waits for device memory (every request keeps its place)",
                            source, exc)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - any failure: the caches go back to where they were
                failure = exc
                log.warning("memory %s: the resize failed (%s: %s); back to %d slots / %d KV pages", source,
                            type(exc).__name__, exc, slots0, kv0)  # fmt: skip
        failed = exact and (failure is not None or (self.num_slots, self.kv_pages) != (split.slots, split.kv_pages))
        asked = split
        if failed or (failure is not None and not isinstance(failure, torch.OutOfMemoryError)):
            self._put_back(slots0, kv0)
            if (self.num_slots, self.kv_pages) == (slots0, kv0):
                split = before  # where it was, budget and all
            else:  # asked again later (``retry``): no watcher may be there to grow the caches back
                self.restore_to = MemorySplit(before.budget_bytes, slots0, kv0, before.reserve_bytes)
        rec = self._settle(split, reason, source, slots0, kv0, preempted, t0)
        if failed:
            raise ResizeError(self._why_not(asked, failure))
        return rec

    def _put_back(self, slots0: int, kv0: int) -> None:
        """After a failed resize: the caches at their sizes before (where the device refuses them now, the refusal
        fallbacks of ``_resize`` keep the engine sound: the fewest, or waiting)."""
        try:
            if self.waiting:
                self.resume()
            if not self.waiting and (self.num_slots, self.kv_pages) != (slots0, kv0):
                f = self.facts
                self._resize(MemorySplit(0, slots0, kv0, f.reserve_bytes), self.num_slots, self.kv_pages)
        except Exception as exc:  # noqa: BLE001 - each cache stays sound on its own (its resize is all or nothing)
            log.warning("memory: putting the caches back to %d slots / %d KV pages failed (%s: %s); now %d / %d",
                        slots0, kv0, type(exc).__name__, exc, self.num_slots, self.kv_pages)  # fmt: skip

    def _why_not(self, split: MemorySplit, failure: BaseException | None) -> str:
        cause = f"{type(failure).__name__}: {failure}" if failure is not None else "the device refused that size"
        now = "waits for device memory" if self.waiting else "is at"
        return (
            f"the resize to {split.budget_bytes / GIB:.3f} GiB ({split.slots} expert slots + {split.kv_pages} KV "
            f"pages) failed: {cause}. What exists: {self.capacity(self.held_bytes).explain()}. The engine {now} "
            f"{self.num_slots} expert slots + {self.kv_pages} KV pages"
        )

    def _settle(
        self, split: MemorySplit, reason: str, source: str, slots0: int, kv0: int, preempted: int, t0: float
    ) -> ResizeRecord:
        """After a resize: the device's memory given back, the split as it is, the record."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the slots' refill copies are part of the resize's time
            if not uses_driver_memory(self.device):
                torch.cuda.empty_cache()  # freed slots and pages go back to the device, for other programs
        got, f = (self.num_slots, self.kv_pages), self.facts
        if got != (split.slots, split.kv_pages):
            log.warning("memory %s: the device refused %d slots / %d KV pages; now %d / %d", source, split.slots,
                        split.kv_pages, *got)  # fmt: skip
            used = got[0] * f.slot_bytes + got[1] * f.page_bytes
            split = MemorySplit(used + f.reserve_bytes, got[0], got[1], f.reserve_bytes)
        self.split = split
        self.plan = replace(self.plan, slots=split.slots, kv_pages=split.kv_pages, budget_bytes=split.budget_bytes,
                            free_bytes=None)  # fmt: skip
        self.scheduler.kv_ceiling = self.base_kv
        rec = ResizeRecord(time.time(), source, reason, round(split.budget_bytes / GIB, 4), slots0, split.slots,
                           kv0, split.kv_pages, preempted, time.perf_counter() - t0)  # fmt: skip
        if (slots0, kv0) != (split.slots, split.kv_pages):
            self.last = rec
            self.num_resizes += 1
            self.history = [*self.history[-(HISTORY - 1) :], rec]
            log.info("memory %s: %d -> %d expert slots, %d -> %d KV pages in %.3f s (%s)%s", source, slots0,
                     split.slots, kv0, split.kv_pages, rec.seconds, reason,
                     f", {preempted} preempted" if preempted else "")  # fmt: skip
        return rec

    def _resize(self, split: MemorySplit, slots0: int, kv0: int) -> int:
        """The slots and the KV pool to ``split``; returns the preemptions. ``torch.OutOfMemoryError`` only when
        the device refused even the fewest (a cache then waits: ``waiting``)."""
        preempted = 0
        f = self.facts
        # a size the device refuses (another program took the memory between the free and the new allocation)
        # falls back: a grow to where it was, then (a shrink at once) to the fewest slots or pages; the KV pool
        # keeps every used page at any size
        if split.slots < slots0:
            try:
                self._resize_slots(split.slots, (f.min_slots,))
            except torch.OutOfMemoryError:
                # another program took what the slots freed and still wants more: the KV pages give way (to the
                # fewest; every used page is kept), and the slots ask again in what that freed
                fewest = max(min(split.kv_pages, f.min_pages), self.scheduler.pages.num_pinned, 1)
                preempted += self.scheduler.resize_kv(fewest)
                split = MemorySplit(split.budget_bytes, split.slots, self.scheduler.kv.num_pages, split.reserve_bytes)
                self._resize_slots(f.min_slots, ())
        if split.kv_pages != self.scheduler.kv.num_pages:
            cur = self.scheduler.kv.num_pages
            back = (cur, f.min_pages) if split.kv_pages > cur else (f.min_pages,)
            preempted += self.scheduler.resize_kv(split.kv_pages, back, self._slots_give_way)
        if split.slots > slots0:
            self._resize_slots(split.slots, (slots0, f.min_slots) if slots0 else (f.min_slots,))
        return preempted

    @property
    def waiting(self) -> bool:
        """A cache without its device memory: a resize the device refused at every size, even the fewest. The
        engine runs no step until ``resume`` is granted (its requests wait in place)."""
        return self.scheduler.kv.waiting or (self.backend is not None and self.backend.slot_range[0] > 0
                                             and self.backend.num_slots == 0)  # fmt: skip

    def resume(self) -> bool:
        """A waiting cache asks again: the fewest slots, the KV pool's used pages. Whether nothing waits now."""
        try:
            if self.backend is not None and self.backend.slot_range[0] > 0 and self.backend.num_slots == 0:
                self._resize_slots(self.facts.min_slots, ())
            if self.scheduler.kv.waiting and not self.scheduler.resume_kv():
                return False
        except Exception as exc:  # noqa: BLE001 - refused (any way): the caches wait on, sound (all or nothing)
            log.debug("memory: the device refused the fewest again (%s: %s)", type(exc).__name__, exc)
            return False
        f = self.facts
        used = self.num_slots * f.slot_bytes + self.kv_pages * f.page_bytes
        self.split = MemorySplit(used + f.reserve_bytes, self.num_slots, self.kv_pages, f.reserve_bytes)
        self.plan = replace(self.plan, slots=self.num_slots, kv_pages=self.kv_pages,
                            budget_bytes=self.split.budget_bytes)  # fmt: skip
        log.info("memory: the device granted the fewest again: %d expert slots, %d KV pages", self.num_slots,
                 self.kv_pages)  # fmt: skip
        return True

    def retry(self) -> None:
        """Asks again for what a failed resize could not put back (``LLMEngine.retry_memory``, a safe point): the
        fewest (``resume``) while a cache waits, then the split before the failure."""
        if self.waiting and not self.resume():
            return
        back, self.restore_to = self.restore_to, None
        if back is not None:
            try:
                self.apply(back, "the split before a failed resize", "restore")
            except Exception as exc:  # noqa: BLE001 - never out of a step or the idle loop; asked again later
                log.warning("memory: asking again for the split before a failed resize: %s: %s", type(exc).__name__,
                            exc)  # fmt: skip
            if (self.num_slots, self.kv_pages) != (back.slots, back.kv_pages):
                self.restore_to = back  # still the split before the first failure

    @property
    def held_bytes(self) -> int:
        """What the resizable caches hold now."""
        return self.num_slots * self.facts.slot_bytes + self.kv_pages * self.facts.page_bytes

    def fault(self) -> str | None:
        """Why no step can run now, None when one can (cheap: ``/health`` reads it at every safe point)."""
        if self.waiting:
            return "the engine waits for device memory (the device refused even the fewest expert slots / KV pages)"
        return self.scheduler.kv.fault()

    @property
    def kv_pages(self) -> int:
        """The KV pool's pages (0 while it waits for device memory)."""
        return 0 if self.scheduler.kv.waiting else self.scheduler.kv.num_pages

    def _slots_give_way(self) -> bool:
        """The KV pool was refused at every size (another program took what it freed and wants more): the slots
        go to the fewest, so the pool can ask again. False when they are there already."""
        if self.backend is None or self.num_slots <= self.facts.min_slots:
            return False
        self._resize_slots(self.facts.min_slots, ())
        return True

    def _resize_slots(self, n: int, fallback: tuple[int, ...]) -> None:
        assert self.backend is not None
        self.backend.resize_expert_cache(n, fallback)

    # ---- introspection --------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        f, s = self.facts, self.split
        return {
            "budget_gib": s.budget_bytes / GIB,
            "target_gib": self.target_bytes / GIB,
            "minimum_gib": f.minimum_budget / GIB,
            "slots": self.num_slots,
            "slots_gib": self.num_slots * f.slot_bytes / GIB,
            "kv_pages": self.kv_pages,
            "kv_gib": self.kv_pages * f.page_bytes / GIB,
            "waiting_for_device_memory": self.waiting,
            "reserve_gib": f.reserve_bytes / GIB,
            "follows_session": self.follow_session,
            "resizes": self.num_resizes,
            "last_resize": self.last.to_dict() if self.last is not None else None,
        }
