"""Server-sent events and client-disconnect handling."""

from __future__ import annotations

import asyncio
import contextlib
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


def sse_response(frames: Frames, every_s: float, ping: bytes = b": keep-alive\n\n") -> StreamingResponse:
    """An SSE response that sends ``ping`` during silences longer than ``every_s``.

    Starlette cancels the iterator when the client disconnects; the protocol generators use
    ``aclosing`` around the engine stream, so that cancellation aborts the engine request.
    """
    body = with_keepalive(frames, ping, every_s)
    return StreamingResponse(body, media_type="text/event-stream", headers=_HEADERS)


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


async def with_keepalive(frames: Frames, ping: bytes, every_s: float) -> Frames:
    """Pass ``frames`` through, sending ``ping`` after every ``every_s`` seconds of silence.

    A tool call's arguments arrive in one piece when the call closes, so a long call would
    otherwise leave the connection silent for minutes (proxies and clients may give up).
    """
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(frames.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield ping
                continue
            finished, pending = pending, None
            try:
                frame = finished.result()
            except StopAsyncIteration:
                return
            yield frame
    finally:
        if pending is not None:  # client gone mid-wait: cancelling unwinds (and aborts) the stream
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await frames.aclose()
