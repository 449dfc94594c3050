"""The app's outer layer in plain ASGI, just inside ``browser.py`` (Host, Origin, content type): whatever goes
wrong inside, the client gets one JSON error in its API's shape and the connection stays usable.

- a declared ``Content-Length`` past the body limit: 413, with the body read and dropped unparsed
  first (a client still uploading when the server closes never sees the answer);
- while the server drains for shutdown: 503 for new requests;
- any exception that escapes a route before the response started: a 500 in the route's API shape,
  sent here so nothing reaches the server's own handler (which closes the keep-alive connection);
  after the response started (a stream), the stream is ended cleanly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import ClientDisconnect

from freetoken.server.errors import APIError, flavor_for_path, too_large

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Guard:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state  # ServerState: config (the body limit), metrics, draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        limit = self.state.config.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            whole = await discard_body(receive)
            await self._reply(send, path, too_large(limit), close=not whole)
            return
        if self.state.draining and path.startswith("/v1/"):
            await self._reply(send, path, APIError("unavailable", "the server is shutting down"), close=True)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:  # the client left mid-body: nobody to answer, nothing went wrong here
            log.debug("client left during the body of %s %s", scope.get("method"), path)
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            if not started:
                err = APIError("server_error", f"internal error: {type(exc).__name__}: {exc}")
                await self._reply(send, path, err)
            else:  # mid-stream: end the body; the protocol generators already sent their error event
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _reply(self, send: Send, path: str, err: APIError, close: bool = False) -> None:
        self.state.metrics.error(err.kind)
        flavor = flavor_for_path(path)
        body = json.dumps(err.body(flavor)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if close:  # the unread body would otherwise be taken for the next request
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": err.status(flavor), "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


DISCARD_CAP = 1 << 30
"""Bytes of an oversize body read and dropped before the connection is closed instead."""


async def discard_body(receive: Receive, cap: int = DISCARD_CAP) -> bool:
    """Reads the rest of the request body without keeping it; False if it ran past ``cap``."""
    seen = 0
    while seen <= cap:
        message = await receive()
        if message["type"] != "http.request":
            return False  # the client went away
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
