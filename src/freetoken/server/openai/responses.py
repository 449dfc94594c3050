"""``POST /v1/responses`` (what Codex speaks), streamed or not; ``GET /v1/responses/{id}`` for stored ones."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from freetoken.server.body import parse_request
from freetoken.server.errors import APIError
from freetoken.server.generation import until_finish
from freetoken.server.internal import ChatRequest
from freetoken.server.openai.protocol import ResponsesRequest
from freetoken.server.openai.responses_input import to_internal
from freetoken.server.openai.responses_output import ResponseBuilder
from freetoken.server.openai.responses_store import ResponseStore, conversation
from freetoken.server.sse import sse, sse_response, unless_disconnected
from freetoken.server.state import get_state

SUMMARY_MODES = ("auto", "concise", "detailed")


async def create_response(request: Request) -> Response:
    state = get_state(request)
    body = await parse_request(request, ResponsesRequest)
    model = state.served_name(body.model)
    gen = state.generation()
    store = state.responses
    earlier = _earlier(store, body.previous_response_id)
    req = await state.off_loop(request, lambda: to_internal(body, earlier))
    prep = await state.off_loop(request, lambda: gen.prepare(req))
    keep = body.store is not False and store.capacity > 0
    builder = ResponseBuilder(
        req,
        model,
        [t.model_dump(exclude_none=True) for t in body.tools or []],
        _echo(body, keep),
        summary=body.reasoning is not None and body.reasoning.summary in SUMMARY_MODES,
    )
    if not body.stream:
        await unless_disconnected(request, gen.feed_all(prep, builder))
        _keep(store, keep, builder, req)
        return JSONResponse(builder.response())
    events = gen.stream(prep, builder.id)
    first = await unless_disconnected(request, gen.first_event(events))
    frames = _frames(builder, first, events, lambda: _keep(store, keep, builder, req))
    return sse_response(frames, state.config.keepalive_s)


async def get_response(request: Request, response_id: str) -> JSONResponse:
    stored = get_state(request).responses.get(response_id)
    if stored is None:
        raise APIError("not_found", f"no stored response with id {response_id!r}", param="response_id")
    return JSONResponse(stored.response)


def _earlier(store: ResponseStore, previous: str | None) -> list[dict[str, Any]] | None:
    if previous is None:
        return None
    stored = store.get(previous)
    if stored is None:
        how = "never stored, or dropped" if store.capacity else "this server stores none: --responses-store 0"
        raise APIError.invalid(
            f"previous response {previous!r} not found ({how}); send the whole conversation in `input`",
            param="previous_response_id",
        )
    return stored.messages


def _echo(body: ResponsesRequest, keep: bool) -> dict[str, Any]:
    reasoning = body.reasoning
    echo: dict[str, Any] = {
        "store": keep,
        "previous_response_id": body.previous_response_id,
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": reasoning.summary if reasoning else None,
        },
    }
    if body.text and isinstance(body.text.get("format"), dict):
        echo["text"] = {"format": body.text["format"]}
    return echo


def _keep(store: ResponseStore, keep: bool, builder: ResponseBuilder, req: ChatRequest) -> None:
    if keep and builder.status in ("completed", "incomplete"):
        store.put(builder.response(), conversation(req.messages, builder.output))


async def _frames(
    builder: ResponseBuilder, first: Any, events: AsyncGenerator[Any, None], done: Any
) -> AsyncGenerator[bytes, None]:
    builder.start()
    try:
        async with aclosing(until_finish(first, events)) as stream:
            async for e in stream:
                builder.feed(e)
                for frame in builder.take():
                    yield sse(frame, event=frame["type"])
        done()
    except APIError as err:
        builder.status = "failed"
        body = err.body("openai")["error"]
        failed = builder.response()
        failed["error"] = {"code": body.get("code") or body["type"], "message": body["message"]}
        yield sse(
            {"type": "response.failed", "sequence_number": builder.seq, "response": failed},
            event="response.failed",
        )
