"""The real HTTP app (``ft serve``'s) under uvicorn on 127.0.0.1, on a free port, in a thread: for benchmarks that
measure through the server (``ft bench agent-edits``) and the server tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from freetoken.server.app import build_app
from freetoken.server.settings import ServerConfig
from freetoken.server.state import ServerState

MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    url: str
    state: ServerState
    server: uvicorn.Server

    @property
    def engine(self) -> Any:
        return self.state.engine


@contextmanager
def serve(
    engine: Any | Callable[[], Any],
    config: ServerConfig | None = None,
    wait_ready: bool = True,
    wrap: Callable[[Any], Any] | None = None,
) -> Iterator[Running]:
    """``wrap``: an ASGI middleware put around the app (e.g. one that records the requests)."""
    config = config or ServerConfig(served_model_names=(MODEL,))
    app = build_app(engine, config)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            wrap(app) if wrap else app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=5,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 120
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "server did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    while wait_ready and httpx.get(url + "/health").status_code != 200:
        assert time.time() < deadline, "engine did not become ready"
        time.sleep(0.1)
    try:
        yield Running(url, app.state.freetoken, server)
    finally:
        server.should_exit = True
        thread.join(30)
