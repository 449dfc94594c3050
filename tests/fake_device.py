"""A fake device for elastic-memory tests on the CPU: what the VRAM watcher reads and, optionally, the allocator
the caches use (``device_zeros``), shared with another program that takes memory."""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch


class FakeDevice:
    """A device of ``capacity`` bytes shared by the engine's slots and KV pages and another program's ``other``
    bytes: what the watcher reads, as NVML would. Without ``zeros`` installed the engine's use is its memory
    split; with it (``install``), the bytes of the live cache tensors, and an allocation that does not fit is
    refused as the driver would (``torch.OutOfMemoryError``). ``take(want)``: the other program asks for ``want``
    bytes and gets what is free; until it has them, it takes whatever the engine frees, the moment it is freed
    (the race between a cache's free and its new allocation that the GPU box showed)."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.other, self.llm = capacity, 0, None
        self.live: int | None = None
        self.want = 0
        self.refusals = 0

    def free_bytes(self) -> int:
        if self.live is not None:
            return self.capacity - self.live - self.other
        eng = self.llm.engine if self.llm is not None else None
        used = eng.memory.split.used_bytes(eng.memory.facts) if eng is not None else 0
        return self.capacity - used - self.other

    def install(self, monkeypatch: Any) -> None:
        """The caches allocate through this device from now on (install before the engine starts)."""
        import freetoken.cache.kv_pool as kv_pool
        import freetoken.experts.slots.cache as slot_cache

        self.live = 0
        for module in (kv_pool, slot_cache):
            monkeypatch.setattr(module, "device_zeros", self.zeros)
            monkeypatch.setattr(module, "free_device_bytes", lambda device: self.free_bytes(), raising=False)

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        assert self.live is not None
        nbytes = math.prod(shape) * dtype.itemsize
        if self.live + nbytes + self.other > self.capacity:
            self.refusals += 1
            raise torch.OutOfMemoryError(f"the fake device has not {nbytes} bytes free")
        t = torch.zeros(shape, dtype=dtype, device=device)
        self.live += nbytes
        weakref.finalize(t, self._freed, nbytes)
        return t

    def take(self, want: int) -> None:
        self.want = want
        self.other = min(want, self.capacity - (self.live or 0))

    def _freed(self, nbytes: int) -> None:
        assert self.live is not None
        self.live -= nbytes
        if self.other < self.want:
            self.other = min(self.want, self.capacity - self.live)
