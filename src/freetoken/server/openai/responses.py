"""``POST /v1/responses`` (what Codex speaks): stateless, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from freetoken.server.body import parse_request
from freetoken.server.errors import APIError
from freetoken.server.generation import until_finish
from freetoken.server.openai.protocol import ResponsesRequest
from freetoken.server.openai.responses_input import to_internal
from freetoken.server.openai.responses_output import ResponseBuilder
from freetoken.server.sse import sse, sse_response, unless_disconnected
from freetoken.server.state import get_state


async def create_response(request: Request) -> Response:
    state = get_state(request)
    body = await parse_request(request, ResponsesRequest)
    state.check_model(body.model)
    gen = state.generation()
    req = await state.off_loop(request, lambda: to_internal(body))
    prep = await state.off_loop(request, lambda: gen.prepare(req))
    builder = ResponseBuilder(req, body.model, [t.model_dump(exclude_none=True) for t in body.tools or []])
    if not body.stream:
        await unless_disconnected(request, gen.feed_all(prep, builder))
        return JSONResponse(builder.response())
    events = gen.stream(prep, builder.id)
    first = await unless_disconnected(request, gen.first_event(events))
    return sse_response(_frames(builder, first, events), state.config.keepalive_s)


async def _frames(
    builder: ResponseBuilder, first: Any, events: AsyncGenerator[Any, None]
) -> AsyncGenerator[bytes, None]:
    builder.start()
    try:
        async with aclosing(until_finish(first, events)) as stream:
            async for e in stream:
                builder.feed(e)
                for frame in builder.take():
                    yield sse(frame, event=frame["type"])
    except APIError as err:
        builder.status = "failed"
        body = err.body("openai")["error"]
        failed = builder.response()
        failed["error"] = {"code": body.get("code") or body["type"], "message": body["message"]}
        yield sse(
            {"type": "response.failed", "sequence_number": builder.seq, "response": failed},
            event="response.failed",
        )
