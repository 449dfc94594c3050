"""``POST /v1/messages`` (what Claude Code speaks), streamed or not."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from freetoken.server.anthropic.builder import MessageBuilder
from freetoken.server.anthropic.convert import to_internal
from freetoken.server.anthropic.protocol import MessagesRequest
from freetoken.server.body import parse_request
from freetoken.server.errors import APIError
from freetoken.server.generation import until_finish
from freetoken.server.sse import sse, sse_response, unless_disconnected
from freetoken.server.state import get_state


async def create_message(request: Request) -> Response:
    state = get_state(request)
    body = await parse_request(request, MessagesRequest)
    model = state.served_name(body.model)
    gen = state.generation()
    prep = await state.off_loop(request, lambda: gen.prepare(to_internal(body)))
    builder = MessageBuilder(model, len(prep.prompt_ids))
    if not body.stream:
        await unless_disconnected(request, gen.feed_all(prep, builder))
        return JSONResponse(builder.message())
    events = gen.stream(prep, builder.id)
    first = await unless_disconnected(request, gen.first_event(events))
    ping = sse({"type": "ping"}, event="ping")
    return sse_response(_frames(builder, first, events), state.config.keepalive_s, ping)


async def _frames(
    builder: MessageBuilder, first: Any, events: AsyncGenerator[Any, None]
) -> AsyncGenerator[bytes, None]:
    builder.start()
    try:
        async with aclosing(until_finish(first, events)) as stream:
            async for e in stream:
                builder.feed(e)
                for kind, payload in builder.take():
                    yield sse(payload, event=kind)
    except APIError as err:
        yield sse(err.body("anthropic"), event="error")
