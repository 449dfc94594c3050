"""The FastAPI app: protocol routers, health, metrics, engine stats, the chat page, auth and error shapes."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from freetoken.memory.budget import BudgetError, ResizeError
from freetoken.server.body import parse_request
from freetoken.server.browser import BrowserSafety
from freetoken.server.chat_page import add_chat_page
from freetoken.server.errors import APIError, flavor_for_path, from_engine_error
from freetoken.server.guard import Guard
from freetoken.server.settings import ServerConfig
from freetoken.server.sse import ClientGone
from freetoken.server.state import ServerState, get_state

if TYPE_CHECKING:
    from freetoken.engine.async_llm import AsyncLLM


def has_api_key(request: Request) -> bool:
    """``Authorization: Bearer KEY`` (OpenAI) or ``x-api-key: KEY`` (Anthropic) matches, or no key is set."""
    key = get_state(request).config.api_key
    if key is None:
        return True
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    return bool(given) and hmac.compare_digest(given.encode(), key.encode())


def check_api_key(request: Request) -> None:
    if not has_api_key(request):
        raise APIError("authentication", "invalid or missing API key (send Authorization: Bearer KEY or x-api-key)")


def build_app(
    engine: AsyncLLM | Callable[[], AsyncLLM],
    config: ServerConfig | None = None,
    own_engine: bool = True,
    on_ready: Callable[[ServerState], None] | None = None,
) -> FastAPI:
    """``engine``: a started engine, or a factory called on the server's event loop at startup.
    ``own_engine``: shut the engine down when the app stops (after in-flight requests drained).
    ``on_ready``: called once the model has loaded (``ft serve`` prints its URL there)."""
    from freetoken.server.anthropic import router as anthropic_router
    from freetoken.server.openai import router as openai_router

    factory = engine if callable(engine) and not hasattr(engine, "generate") else None
    state = ServerState(None if factory else engine, config or ServerConfig())  # type: ignore[arg-type]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if factory is not None:
            state.engine = factory()
        watcher = asyncio.ensure_future(_announce(state, on_ready)) if on_ready else None
        yield
        if watcher is not None:
            watcher.cancel()
        if own_engine:
            await state.engine.shutdown(drain=False)

    app = FastAPI(title="FreeToken", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.freetoken = state
    auth = [Depends(check_api_key)]
    app.include_router(openai_router(), dependencies=auth)
    app.include_router(anthropic_router(), dependencies=auth)
    _add_control_routes(app, state)
    _add_memory_route(app, state)
    add_chat_page(app)
    _add_error_handlers(app, state)
    app.add_middleware(Guard, state=state)
    app.add_middleware(BrowserSafety, state=state)  # added last: the outermost (Host, Origin, content type)
    return app


async def _announce(state: ServerState, on_ready: Callable[[ServerState], None]) -> None:
    try:
        await state.engine.wait_ready()
    except Exception:
        return  # /health reports the failure
    on_ready(state)


def _add_control_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        """The liveness probe, open without the API key; with a key set, only the key's holders learn
        more than the status. ``ok`` only while the engine can generate (``AsyncLLM.health``), else 503."""
        eng = state.engine
        detail = has_api_key(request)
        if state.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        problem = eng.health() if eng.state == "ready" else None  # can it generate now (its thread, its caches)
        if eng.state == "ready" and problem is None:
            body: dict[str, Any] = {"status": "ok", "model": state.model_names[0]} if detail else {"status": "ok"}
            check = eng.stats().get("weights_check", "ok")  # an FTW checkpoint's checksums
            if detail and check != "ok":
                body["weights_check"] = check
            return JSONResponse(body)
        if eng.state == "loading":
            return JSONResponse({"status": "loading"}, status_code=503)
        body = {"status": "unhealthy", "error": problem or eng.error} if detail else {"status": "unhealthy"}
        return JSONResponse(body, status_code=503)

    @app.get("/metrics", dependencies=[Depends(check_api_key)])
    async def metrics() -> PlainTextResponse:
        stats = state.engine.stats() if state.engine.state == "ready" else {}
        return PlainTextResponse(
            state.metrics.render(stats, state.engine.state), media_type="text/plain; version=0.0.4"
        )

    @app.get("/v1/engine/stats", dependencies=[Depends(check_api_key)])
    async def engine_stats() -> JSONResponse:
        eng = state.engine
        stats = eng.stats() if eng.state == "ready" else {}
        server = {
            "requests_total": state.metrics.requests_total,
            "requests_running": state.metrics.requests_running,
            "generated_tokens_total": state.metrics.generated_tokens_total,
            "tokens_per_second": state.metrics.tokens_per_second(),
        }
        return JSONResponse({"state": eng.state, "error": eng.error, "engine": stats, "server": server})


class MemoryBody(BaseModel):
    """``POST /v1/engine/memory``: the new VRAM budget (slots + KV pages + reserve), in GiB."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    vram_budget: float = Field(description="GiB")
    reason: str = Field(default="set through the API", max_length=200)


def _add_memory_route(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/engine/memory", dependencies=[Depends(check_api_key)])
    async def engine_memory_plan() -> JSONResponse:
        """The memory plan: every share (weights, expert slots, KV pages, recurrent states and checkpoints on the
        device and in host RAM, activations, reserve) in bytes and counts, as the last resize left it."""
        plan = state.engine.memory_plan() if state.engine.state == "ready" else None
        if plan is None:
            raise APIError("unavailable", f"the engine is {state.engine.state}")
        return JSONResponse({"plan": plan})

    @app.post("/v1/engine/memory", dependencies=[Depends(check_api_key)])
    async def engine_memory(request: Request) -> JSONResponse:
        """Resizes the expert slots and KV pages to a new budget at the engine's next safe point, all or nothing.
        A budget below the minimum or above what the machine has is a 400 that names the numbers (checked before
        anything changes); memory the machine refused during the resize is a 503 (the engine is back at its split
        before; the message says what was asked and what exists)."""
        body = await parse_request(request, MemoryBody)
        if state.engine.state != "ready":
            raise APIError("unavailable", f"the engine is {state.engine.state}")
        try:
            split = await state.engine.set_vram_budget(body.vram_budget, body.reason)
        except BudgetError as exc:
            raise APIError.invalid(str(exc), param="vram_budget") from exc
        except ResizeError as exc:
            raise APIError("unavailable", str(exc), param="vram_budget", code="resize_failed") from exc
        except Exception as exc:
            raise from_engine_error(exc) from exc
        return JSONResponse({"memory": split})


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    def render(request: Request, err: APIError) -> JSONResponse:
        state.metrics.error(err.kind)
        flavor = flavor_for_path(request.url.path)
        return JSONResponse(err.body(flavor), status_code=err.status(flavor))

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return render(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return render(request, APIError.invalid(str(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {401: "authentication", 404: "not_found"}.get(exc.status_code, "invalid_request")
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        err = APIError(kind, msg)  # type: ignore[arg-type]
        resp = render(request, err)
        resp.status_code = exc.status_code
        return resp

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)

    # Any other exception: guard.py answers it (a handler for Exception here would run in Starlette's
    # outermost layer, which re-raises, and the server would drop the keep-alive connection).
