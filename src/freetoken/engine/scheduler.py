"""Continuous batching over the paged KV pool.

Each step: running requests first (oldest first) get their next tokens (1 when decoding, a prompt
chunk otherwise) within the token budget; then waiting requests join while there is room. When the
KV pool runs out, the newest running request is preempted (pages freed, recomputed later) so the
older ones always progress: no deadlock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from freetoken.cache.kv_pool import KVPool
from freetoken.engine.request import Request, Status


@dataclass
class ScheduledBatch:
    items: list[tuple[Request, int]]  # (request, new tokens computed this step)
    never_fit: list[Request]  # requests that cannot fit even alone: to be finished with an error

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(self, kv: KVPool, max_running: int, max_batched_tokens: int) -> None:
        self.kv = kv
        self.max_running = max_running
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _grow(self, req: Request, n: int) -> bool:
        """Make req's pages cover num_computed + n tokens; False when the pool is short."""
        need = self.kv.pages_for(req.num_computed_tokens + n) - len(req.pages)
        if need <= 0:
            return True
        if need > self.kv.num_free:
            return False
        req.pages += self.kv.allocate(need, req.request_id)
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req.pages, req.request_id)
        req.pages = []
        req.num_computed_tokens = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def schedule(self) -> ScheduledBatch:
        budget = self.max_batched_tokens
        items: list[tuple[Request, int]] = []
        never_fit: list[Request] = []
        for req in list(self.running):
            if req not in self.running or budget <= 0:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self._grow(req, n):
                victim = self.running[-1]
                if victim is req and len(self.running) == 1:
                    never_fit.append(req)
                    break
                self._preempt(victim)
                items = [(r, k) for r, k in items if r is not victim]
                if victim is req:
                    break
            else:
                items.append((req, n))
                budget -= n
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            req = self.waiting[0]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._grow(req, n):
                if not self.running and self.kv.pages_for(req.num_tokens + 1) > self.kv.num_pages:
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

    def finish(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.pages:
            self.kv.free(req.pages, req.request_id)
            req.pages = []
        req.status = Status.FINISHED

    def page_tables(self) -> dict[str, list[int]]:
        return {r.request_id: r.pages for r in [*self.running, *self.waiting] if r.pages}
