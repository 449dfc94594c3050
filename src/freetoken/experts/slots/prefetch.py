"""Fills ahead of their layer: experts known before the layer runs (DeepSeek-V4's hash layers route by token id,
``tid2eid[input_ids]``, so the step's first layers' experts are known when the step starts) are made resident on a
side stream while the layers before them compute, and held until their layer has planned.

Per decode step and prefetched layer (``issue``, before the model's first layer; device ops only, no host sync):
- a plan over the layer's routes (``plan_fills``, every miss filled: share 1) picks LRU victims among the slots no
  lock holds, maps the eids and stamps them, on the compute stream (the tables stay in stream order);
- the slots serving those routes are locked (their former lock state kept), so no plan of an earlier layer of the
  step, nor another prefetch, takes them;
- the copies run on a side stream that first waits for everything enqueued on the compute stream so far: kernels of
  earlier steps still reading a victim slot are done before it is overwritten (DESIGN §6.3); an event marks them.
``before(layer)``: the compute stream waits for that event (the layer's plan finds hits, its GEMM reads the rows).
``after(layer)``: the locks go back to what they were. On the CPU the copies run in place, in order. Inside a captured
decode step all of it is graph nodes (the side stream forks from the capture and joins it at ``before``), so every
replay fills ahead; only the host's counts (``layers``, ``skipped``) see the capture alone.

A step prefetches only while every prefetched layer's routes and one more layer's fit the slots at once
(``layers + 1`` times ``min(T * k, E)`` <= S, from shapes alone): a layer's plan then always finds victims for its
misses among the unlocked slots, and offload's rounds stay enough. Larger steps skip (counted).
"""

from __future__ import annotations

import torch

from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.plan import plan_fills


class Prefetcher:
    def __init__(self, cache: SlotCache) -> None:
        self.cache = cache
        dev = cache.device
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self.fills = torch.zeros((), dtype=torch.long, device=dev)  # experts copied ahead (device count)
        self.layers = 0  # layer prefetches issued
        self.skipped = 0  # layer prefetches skipped: the step's routes would not fit beside the others
        self._one = torch.ones((), dtype=torch.float32, device=dev)
        # layer -> (slots locked for it [K] (S: padding), their former lock state [K], the copies' event)
        self._held: dict[int, tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]] = {}

    def fits(self, layers: int, topk_ids: torch.Tensor) -> bool:
        """Whether ``layers`` prefetched layers of these routes' size leave one more layer room (shapes only)."""
        n = min(topk_ids.numel(), self.cache.pool.num_experts)
        return (layers + 1) * n <= self.cache.num_slots

    def issue(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Make layer ``layer``'s routes ``topk_ids`` [T, k] resident ahead and hold them until ``after(layer)``."""
        c = self.cache
        if layer in self._held or not self.fits(len(self._held) + 1, topk_ids):
            self.skipped += 1
            return
        t, S = c.tables, c.num_slots
        groups = c.group(layer, topk_ids)
        plan = plan_fills(t, groups, groups.valid, self._one, max_distinct=c.pool.num_experts)
        slots = torch.where(plan.slot >= 0, plan.slot, S)  # every valid group is served: resident or filled
        was = t.locked.gather(0, slots)
        t.locked.scatter_(0, slots, torch.ones_like(was))
        t.locked[S:] = False
        event = None
        if self.stream is None:
            c.copy(plan)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(c.device))
            with torch.cuda.stream(self.stream):
                c.copy(plan)
                event = torch.cuda.Event()
                event.record(self.stream)
            for x in (plan.copy_src, plan.copy_dst, plan.copy_count):
                x.record_stream(self.stream)
        self.fills += plan.copy_count
        self.layers += 1
        self._held[layer] = (slots, was, event)

    def before(self, layer: int) -> None:
        """The compute stream waits for layer ``layer``'s copies (no host wait)."""
        held = self._held.get(layer)
        if held is not None and held[2] is not None:
            torch.cuda.current_stream(self.cache.device).wait_event(held[2])

    def after(self, layer: int) -> None:
        """Layer ``layer`` has planned (its prefetched experts were hits): its slots' locks go back as they were."""
        held = self._held.pop(layer, None)
        if held is None:
            return
        slots, was, _ = held
        t = self.cache.tables
        t.locked.scatter_(0, slots, was)
        t.locked[self.cache.num_slots :] = False

    def release(self) -> None:
        """Every hold dropped (a step that ended without running a prefetched layer; a resize)."""
        for layer in list(self._held):
            self.before(layer)
            self.after(layer)

    def stats(self) -> dict[str, int]:
        return {"expert_prefetches": int(self.fills), "prefetch_layers": self.layers,
                "prefetch_skipped": self.skipped}  # fmt: skip
