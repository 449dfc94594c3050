"""What every route needs: the engine, settings, metrics, and small request helpers."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from fastapi import Request

from freetoken.server.errors import APIError
from freetoken.server.heavy import HEAVY_BYTES, HeavyGate
from freetoken.server.metrics import ServerMetrics
from freetoken.server.settings import ServerConfig

T = TypeVar("T")

if TYPE_CHECKING:
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.server.generation import Generation


class ServerState:
    def __init__(self, engine: AsyncLLM, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.metrics = ServerMetrics()
        self.draining = False  # shutting down: new /v1 requests get 503 (guard.py)
        # Rendering and tokenising run off the event loop: small requests on their own threads, bodies
        # past body.HEAVY_BYTES one at a time on another, so a huge one never holds up the rest.
        self.executor = ThreadPoolExecutor(4, thread_name_prefix="ft-prepare")
        self.heavy_executor = ThreadPoolExecutor(1, thread_name_prefix="ft-prepare-heavy")
        self._heavy_gate: HeavyGate | None = None  # made on the server's event loop (asyncio.Lock)
        self._generation: Generation | None = None
        from freetoken.server.openai.responses_store import ResponseStore

        self.responses = ResponseStore(config.responses_store)

    @property
    def model_names(self) -> list[str]:
        if self.config.served_model_names:
            return list(self.config.served_model_names)
        names = [self.engine.model_name]
        base = os.path.basename(os.path.normpath(self.engine.model_name or ""))
        if base and base not in names:
            names.append(base)
        return names

    def served_name(self, name: str) -> str:
        """The id a response names for a request that asked for ``name``: the name itself where this server serves
        it, else its first served name. Any name is answered by the loaded model (a client configured for
        "gpt-4o" or "claude-sonnet-4-5" works), and the response says which model answered."""
        names = self.model_names
        return name if name in names else names[0]

    async def end_requests(self, message: str, every_s: float = 0.1) -> None:
        """Shutdown: every request ends now with a 503 in its API's shape (``ShuttingDownError``: streams
        with their error event, queued ones with a JSON error), and so does every one that reaches the
        engine later (one that was still being prepared), until this is cancelled."""
        from freetoken.engine.errors import ShuttingDownError

        fail = getattr(self.engine, "fail_all", None)
        if fail is None:
            return
        while True:
            if self.metrics.requests_running:
                fail(ShuttingDownError(message))
            await asyncio.sleep(every_s)

    @property
    def heavy_gate(self) -> HeavyGate:
        if self._heavy_gate is None:
            self._heavy_gate = HeavyGate()
        return self._heavy_gate

    async def off_loop(self, request: Request, work: Callable[[], T]) -> T:
        """``work()`` on a preparation thread; for a request whose body was heavy, on the heavy thread
        and through the heavy gate (heavy.py)."""
        loop = asyncio.get_running_loop()
        if int(getattr(request.state, "body_bytes", 0)) <= HEAVY_BYTES:
            return await loop.run_in_executor(self.executor, work)
        return await self.heavy_gate.run(loop.run_in_executor(self.heavy_executor, work))

    def capabilities(self) -> dict[str, bool]:
        """What clients may rely on: tool calls read from the model's output, a reasoning block."""
        from freetoken.server.structured import parsers

        gen = self.generation()
        tool, reasoning = parsers(gen.family, gen.tool_parser, gen.reasoning_parser)
        return {"tool_calls": tool is not None, "reasoning": reasoning is not None}

    def generation(self) -> Generation:
        """The serving core, once the engine is ready (503 while loading, 500 if it died)."""
        eng = self.engine
        if eng.state == "loading":
            raise APIError("unavailable", "the model is still loading; retry shortly")
        if eng.state != "ready":
            raise APIError("server_error", f"the engine is not running: {eng.error or eng.state}")
        if self._generation is None:
            from freetoken.chat import detect_family
            from freetoken.server.generation import Generation

            cfg = self.config
            self._generation = Generation(
                eng,
                self.metrics,
                detect_family(eng.model_type, eng.chat_template),
                tool_parser=cfg.tool_parser,
                reasoning_parser=cfg.reasoning_parser,
            )
        return self._generation


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.freetoken
    return state
