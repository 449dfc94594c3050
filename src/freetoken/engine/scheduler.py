"""Continuous batching over the paged KV pool.

Each step: running requests first (oldest first) get their next tokens (1 when decoding, a prompt
chunk otherwise) within the token budget; then waiting requests join while there is room, each
starting after its longest prefix cached in the radix tree. When the KV pool runs out, unlocked
tree pages are evicted first; then the newest running request is preempted (its computed pages
go to the tree, it is recomputed later, mostly from there) so the older ones always progress: no
deadlock. Which pages a request holds is the KV manager's business (kv_manager.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from freetoken.engine.kv_manager import KVManager
from freetoken.engine.request import Request, Status


@dataclass
class ScheduledBatch:
    items: list[tuple[Request, int]]  # (request, new tokens computed this step)
    never_fit: list[Request]  # requests that cannot fit even alone: to be finished with an error

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(self, pages: KVManager, max_running: int, max_batched_tokens: int) -> None:
        self.pages = pages
        self.kv = pages.kv
        self.max_running = max_running
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        # the KV pages the pool returns to (elastic memory sets it): a request that fits them but not the pool of
        # the moment (shrunk while another program holds the memory) waits instead of failing
        self.kv_ceiling = 0

    @property
    def most_pages(self) -> int:
        return max(self.kv.num_pages, self.kv_ceiling)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def preempt(self, req: Request) -> None:
        """Sends a running request back to the front of the queue: its computed pages go to the tree, it is
        recomputed from there (a failed overlapped launch may have advanced its recurrent state: ``overlap.py``)."""
        self._preempt(req)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.pages.release(req)
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def schedule(self, admit: bool = True) -> ScheduledBatch:
        """``admit=False``: running requests only (a layer-major prefill is in flight). Busy requests (that
        prefill's) are neither scheduled nor preempted."""
        budget = self.max_batched_tokens
        items: list[tuple[Request, int]] = []
        never_fit: list[Request] = []
        for req in list(self.running):
            if req not in self.running or budget <= 0 or req.busy:
                continue
            n = self.pages.chunk(req, min(req.num_tokens - req.num_computed_tokens, budget))
            while not self.pages.grow(req, n):
                victim = next(r for r in reversed(self.running) if not r.busy)  # req itself at the latest
                if victim is req and len(self.running) == 1:
                    if self.kv.num_pages < self.kv_ceiling >= self.kv.pages_for(req.num_computed_tokens + n):
                        self._preempt(req)  # a pool the device shrank under it: it waits for the pool to grow back
                    else:
                        never_fit.append(req)
                    break
                self._preempt(victim)
                items = [(r, k) for r, k in items if r is not victim]
                if victim is req:
                    break
            else:
                items.append((req, n))
                budget -= n
        while admit and self.waiting and len(self.running) < self.max_running and budget > 0:
            req = self.waiting[0]
            n = self.pages.admit(req, budget)
            if n == 0:
                if not self.running and self.kv.pages_for(req.num_tokens + 1) > self.most_pages:
                    self.waiting.popleft()
                    never_fit.append(req)
                    continue
                break
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            items.append((req, n))
            budget -= n
        return ScheduledBatch(items, never_fit)

    def resize_kv(
        self, num_pages: int, fallback: Sequence[int] = (), make_room: Callable[[], bool] | None = None
    ) -> int:
        """A safe point: the KV pool becomes ``num_pages`` pages. Shrinking evicts unlocked prefix-cache pages
        first (LRU); only when none is left are running requests preempted, newest first (their computed pages
        enter the tree and are evicted in turn; they resume by recomputing). ``fallback``: the sizes to fall to
        when the device refuses this one, ``make_room`` when it refuses them all (``KVPool.resize``; every used page
        is kept). Returns the preemptions."""
        preempted = 0
        while self.pages.evict_for_shrink(num_pages) > 0:
            if not self.running:
                raise AssertionError("KV pages are in use with no running request to give them back")
            self._preempt(self.running[-1])
            preempted += 1
        self.pages.resize(num_pages, self.running, fallback, make_room)
        return preempted

    def resume_kv(self) -> bool:
        """A KV pool that waits for device memory (``KVPool.waiting``) asks again; whether it has layers now."""
        return self.pages.resume([*self.running, *self.waiting])

    def finish(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.pages.release(req)
        req.status = Status.FINISHED

    def check_integrity(self) -> None:
        self.pages.check_integrity([*self.running, *self.waiting])
