"""What every route needs: the engine, settings, metrics, and small request helpers."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from freetoken.server.errors import APIError
from freetoken.server.metrics import ServerMetrics
from freetoken.server.settings import ServerConfig

if TYPE_CHECKING:
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.server.generation import Generation

M = TypeVar("M", bound=BaseModel)


class ServerState:
    def __init__(self, engine: AsyncLLM, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.metrics = ServerMetrics()
        self._generation: Generation | None = None

    @property
    def model_names(self) -> list[str]:
        if self.config.served_model_names:
            return list(self.config.served_model_names)
        names = [self.engine.model_name]
        base = os.path.basename(os.path.normpath(self.engine.model_name or ""))
        if base and base not in names:
            names.append(base)
        return names

    def check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise APIError(
                "not_found",
                f"model {name!r} not found; this server serves {', '.join(map(repr, self.model_names))}",
                param="model",
                code="model_not_found",
            )

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


async def read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError.invalid(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError.invalid("request body must be a JSON object")
    return body


def parse_body(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more errors)" if exc.error_count() > 1 else ""
        raise APIError.invalid(f"{loc}: {first['msg']}{more}", param=loc or None) from exc
