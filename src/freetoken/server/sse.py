"""Server-sent events and client-disconnect handling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

T = TypeVar("T")
Frames = AsyncGenerator[bytes, None]

_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(data: Any, event: str | None = None) -> bytes:
    """One SSE frame; ``data`` is JSON-encoded unless it is already a string."""
    body = data if isinstance(data, str) else dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {body}\n\n".encode()


def sse_response(frames: AsyncGenerator[bytes, None]) -> StreamingResponse:
    # Starlette cancels the iterator when the client disconnects; the protocol generators use
    # ``aclosing`` around the engine stream, so that cancellation aborts the engine request.
    return StreamingResponse(frames, media_type="text/event-stream", headers=_HEADERS)


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def unless_disconnected(request: Request, work: Awaitable[T], poll_s: float = 0.25) -> T:
    """Await ``work`` but cancel it (aborting its engine request) if the client goes away.

    Non-streamed answers and the wait for a stream's first event have no response body yet, so
    Starlette cannot notice a disconnect for us.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                try:
                    await task
                except BaseException:
                    pass
                raise ClientGone()
    except asyncio.CancelledError:
        task.cancel()
        raise
