"""Run the real HTTP app under uvicorn on 127.0.0.1 (free port) in a thread, for the server tests."""

from __future__ import annotations

import socket
import sys
import threading
import time
import types
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


def _template_shim() -> None:
    """Until freetoken.chat.template lands: HF's renderer (tests only)."""
    try:
        import freetoken.chat.template  # noqa: F401
    except ImportError:
        m = types.ModuleType("freetoken.chat.template")

        def render_and_tokenize(tok: Any, template: str, messages: Any, tools: Any, **kw: Any) -> list[int]:
            text = tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False, **kw)
            return list(tok.encode(text, add_special_tokens=False))

        m.render_and_tokenize = render_and_tokenize  # type: ignore[attr-defined]
        sys.modules["freetoken.chat.template"] = m


_template_shim()


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
    engine: Any | Callable[[], Any], config: ServerConfig | None = None, wait_ready: bool = True
) -> Iterator[Running]:
    config = config or ServerConfig(served_model_names=(MODEL,))
    app = build_app(engine, config)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5)
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
