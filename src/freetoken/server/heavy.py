"""Heavy requests (bodies past ``HEAVY_BYTES``) take turns and a bounded share of the server's time.

Reading, parsing and rendering a multi-megabyte body is work on the server's one process; a client
sending such bodies back to back would otherwise take the CPU (and the interpreter lock the engine
thread needs) from every other stream. So heavy work runs one piece at a time, and after a piece that
took ``t`` seconds the next one waits until ``t / share`` seconds after the first began.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

HEAVY_BYTES = 1 << 20
"""Bodies past this are heavy."""


class HeavyGate:
    def __init__(self, share: float = 0.2) -> None:
        self.share = share
        self._lock = asyncio.Lock()
        self._next = 0.0  # monotonic time before which no heavy work starts

    async def run(self, work: Awaitable[T]) -> T:
        async with self._lock:
            wait = self._next - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            start = time.monotonic()
            try:
                return await work
            finally:
                now = time.monotonic()
                self._next = start + (now - start) / self.share
