"""``POST /v1/messages/count_tokens``: the prompt's length under the model's chat template."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse

from freetoken.server.anthropic.convert import to_internal
from freetoken.server.anthropic.protocol import CountTokensRequest
from freetoken.server.state import get_state, parse_body, read_json


async def count_tokens(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse_body(CountTokensRequest, await read_json(request))
    state.check_model(body.model)
    req = to_internal(body)
    req.validate()
    ids = await asyncio.to_thread(state.generation().render, req)  # long prompts: keep the loop free
    return JSONResponse({"input_tokens": len(ids)})
