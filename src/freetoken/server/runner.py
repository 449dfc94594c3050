"""Running the app under uvicorn with the shutdown FreeToken promises.

On SIGTERM or Ctrl-C: stop accepting connections, answer new requests on open ones with 503, let
running requests finish for ``ServerConfig.shutdown_timeout_s``, then end each with a 503 error in
its API's shape (streams with their error event), and exit 0. uvicorn alone would cancel what
outlasts its timeout (cut streams, plain-text 500s, a CancelledError traceback) and re-raise the
signal afterwards (exit status 143).
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
_BACKSTOP_S = 10.0  # uvicorn cancels what still runs this long after our own timeout


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Future[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and self._loop is not None:
            self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.ensure_future(self.state.drain(self.state.config.shutdown_timeout_s))

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's, except that a signal that led to a clean shutdown is not raised again."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run(app: Any, state: ServerState, log_level: str = "warning") -> None:
    cfg = state.config
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=log_level,
        timeout_graceful_shutdown=int(cfg.shutdown_timeout_s + _BACKSTOP_S),
    )
    GracefulServer(config, state).run()
