"""``POST /v1/messages/count_tokens``: the prompt's length under the model's chat template, within the limits
of generation (the body limit, the context: a prompt no request could send is refused, not tokenised in full)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from freetoken.server.anthropic.convert import to_internal
from freetoken.server.anthropic.protocol import CountTokensRequest
from freetoken.server.body import parse_request
from freetoken.server.state import get_state


async def count_tokens(request: Request) -> JSONResponse:
    state = get_state(request)
    body = await parse_request(request, CountTokensRequest)
    gen = state.generation()

    def count() -> int:
        return gen.count(to_internal(body))

    return JSONResponse({"input_tokens": await state.off_loop(request, count)})
