"""Running the app under uvicorn with the shutdown FreeToken promises.

The first SIGTERM or Ctrl-C drains: stop accepting connections, answer new requests on open ones with
503, let running requests finish for ``ServerConfig.shutdown_timeout_s``, then end each with a 503
error in its API's shape (streams with their error event, queued requests with a JSON error).
A second signal while requests are still in flight cuts the wait short: every one of them ends the same
way at once. A third stops the process without waiting for anything.

``run`` returns the exit status: 0 when the drain completed, 128 + the signal's number (130 for a
second Ctrl-C) when a second signal cut it, 1 when requests outlasted even their error (a client that
stops reading). uvicorn alone would cancel what outlasts its timeout or a second Ctrl-C (cut streams,
plain-text 500s, a CancelledError traceback), re-raise the signal afterwards, and say nothing of what
was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import uvicorn

from freetoken.server.state import ServerState

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_ERROR_GRACE_S = 5.0  # once every request was told to end: time for the errors to reach their clients
_BACKSTOP_S = 10.0  # uvicorn cancels what still runs this long after our own limits
_POLL_S = 0.05


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.exit_status = 0
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cut: asyncio.Event | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._cut = asyncio.Event()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's own would force its exit on a second Ctrl-C (requests cancelled, not ended)."""
        self._signals += 1
        self.should_exit = True
        if self._loop is None:
            return
        if self._signals == 1:
            self._loop.call_soon_threadsafe(self._start, self._drain())
        elif self._signals == 2:
            self._loop.call_soon_threadsafe(self._cut_short, sig)
        else:
            self._loop.call_soon_threadsafe(self._give_up, 128 + sig)

    def _start(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)  # a reference, so the task is not collected mid-way
        task.add_done_callback(self._tasks.discard)

    def _in_flight(self) -> bool:
        return bool(self.server_state.tasks)

    def _cut_short(self, sig: int) -> None:
        if self._in_flight():  # else the drain had nothing left to wait for: it completed
            self.exit_status = 128 + sig
        assert self._cut is not None
        self._cut.set()

    def _give_up(self, status: int) -> None:
        if self._in_flight() and not self.exit_status:
            self.exit_status = status
        self.force_exit = True

    async def _drain(self) -> None:
        timeout = self.state.config.shutdown_timeout_s
        self.state.draining = True
        assert self._cut is not None
        cut = self._cut
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(cut.wait(), timeout)
        why = "interrupted by a second signal" if cut.is_set() else f"after {timeout:g} s"
        self._start(self.state.end_requests(f"the server is shutting down ({why})"))
        if not await self._settled(_ERROR_GRACE_S):
            self._give_up(1)

    async def _settled(self, within_s: float) -> bool:
        """Whether every request's response was sent within ``within_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while self._in_flight():
            if loop.time() > deadline:
                return False
            await asyncio.sleep(_POLL_S)
        return True

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's, except that the signal is not raised again afterwards: ``exit_status`` tells."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run(app: Any, state: ServerState, log_level: str = "warning") -> int:
    """Serves until a signal ends the process; returns its exit status (see the module's doc)."""
    cfg = state.config
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=log_level,
        timeout_graceful_shutdown=int(cfg.shutdown_timeout_s + _ERROR_GRACE_S + _BACKSTOP_S),
    )
    server = GracefulServer(config, state)
    server.run()
    return server.exit_status
