"""The VRAM watcher: reads the device's free memory and tells the engine when to shrink or grow.

``watch_decision`` is the policy, a pure function of one reading (testable with any free-memory
source): free memory under the reserve shrinks the budget by the shortfall plus half a hysteresis
band (slots first, then KV pages: ``memory.split_budget``), doubled for each shrink that follows the
last within a second, so a program that keeps allocating meets a few large shrinks rather than many
small ones; free memory above the reserve plus the band grows it back towards the budget set by hand,
leaving half the band free, so neither move triggers the other. ``VramWatcher`` is the thread: it
polls a ``FreeMemorySource`` (NVML through ``nvidia-ml-py``: ``NvmlSource``; off, said once, where
NVML is missing) and posts a reading to the engine thread only when the policy would act and no
earlier reading is still waiting; the engine decides at its next safe point.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from freetoken.memory.budget import GIB, MIB

log = logging.getLogger(__name__)

POLL_S = 0.1
MIN_HYSTERESIS = 512 * MIB
STREAK_S = 1.0  # shrinks closer together than this double the step: a program is still allocating
MAX_STREAK = 5


class FreeMemorySource(Protocol):
    def free_bytes(self) -> int: ...


def hysteresis_for(reserve_bytes: int) -> int:
    return max(MIN_HYSTERESIS, reserve_bytes)


def watch_decision(
    free_bytes: int, reserve_bytes: int, budget_bytes: int, target_bytes: int, minimum_bytes: int, streak: int = 0
) -> tuple[int, str] | None:
    """(new budget, why) for one reading of the device's free memory, or None: leave the budget as it is.
    Never below ``minimum_bytes``, never above ``target_bytes`` (the budget set by hand). ``streak``: shrinks
    in a row, each within ``STREAK_S`` of the last (a program still allocating): each doubles the step."""
    band = hysteresis_for(reserve_bytes)
    if free_bytes < reserve_bytes:  # give the shortfall and half the band: free lands where a grow leaves it
        give = (reserve_bytes - free_bytes + band // 2) << min(streak, MAX_STREAK)
        new = max(minimum_bytes, budget_bytes - give)
        if new >= budget_bytes:
            return None  # at the minimum already: nothing left to give
        return new, f"free VRAM {free_bytes / GIB:.2f} GiB < reserve {reserve_bytes / GIB:.2f} GiB"
    if free_bytes > reserve_bytes + band and budget_bytes < target_bytes:
        new = min(target_bytes, budget_bytes + free_bytes - reserve_bytes - band // 2)
        if new < minimum_bytes:
            return None  # caches the device cut below the minimum grow once the minimum fits (no split is smaller)
        return new, f"free VRAM {free_bytes / GIB:.2f} GiB > reserve + {band / GIB:.2f} GiB hysteresis"
    return None


class NvmlSource:
    """The device's free memory as NVML reports it (every process's allocations count), plus what torch's caching
    allocator holds unused in this process: the engine's own step temporaries, which its next step reuses (without
    them a long prefill's cached blocks would read as another program's memory and shrink the caches)."""

    _said = False

    def __init__(self, nvml: Any, handle: Any, device: torch.device | None = None) -> None:
        self._nvml, self._handle, self._device = nvml, handle, device

    @classmethod
    def open(cls, device: torch.device) -> NvmlSource | None:
        """None (said once per process) when NVML is not installed or does not see the device."""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
            try:  # the device's UUID names it whatever CUDA_VISIBLE_DEVICES renumbered
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            except Exception:  # noqa: BLE001 - no UUID from this torch or driver: the index then
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as exc:  # noqa: BLE001 - any failure: no watcher, the engine runs as sized
            if not cls._said:
                cls._said = True
                why = f"{type(exc).__name__}: {exc}"
                log.warning("VRAM watcher off: NVML is unavailable (%s); install nvidia-ml-py", why)
            return None
        return cls(pynvml, handle, device)

    def free_bytes(self) -> int:
        free = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).free)
        if self._device is None:
            return free
        return free + max(0, torch.cuda.memory_reserved(self._device) - torch.cuda.memory_allocated(self._device))


class VramWatcher:
    """Polls ``source`` every ``period_s``; ``wants(free)`` says whether the engine would act on a reading
    (``watch_decision`` on its current budget), ``post(free)`` hands the reading to the engine thread, which
    calls ``done()`` once it handled it (until then no other reading is posted)."""

    def __init__(
        self,
        source: FreeMemorySource,
        wants: Callable[[int], bool],
        post: Callable[[int], None],
        period_s: float = POLL_S,
    ) -> None:
        self.source, self.wants, self.post, self.period_s = source, wants, post, period_s
        self.readings = 0
        self._pending = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freetoken-vram-watch", daemon=True)

    def start(self) -> VramWatcher:
        self._thread.start()
        return self

    def done(self) -> None:
        self._pending.clear()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                free = self.source.free_bytes()
            except Exception as exc:  # noqa: BLE001 - a failing source stops the watcher, never the engine
                log.warning("VRAM watcher stopped: %s: %s", type(exc).__name__, exc)
                return
            self.readings += 1
            if not self._pending.is_set() and self.wants(free):
                self._pending.set()
                self.post(free)
