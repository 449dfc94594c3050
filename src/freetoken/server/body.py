"""Reading a request body: at most ``ServerConfig.max_body_bytes`` (413 past it, before anything is
parsed), parsed and validated in one pass by pydantic's JSON parser (depth-limited: a body nested
deeper than it allows is a 400, not a recursion error)."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from freetoken.server.errors import APIError, too_large
from freetoken.server.heavy import HEAVY_BYTES
from freetoken.server.state import get_state

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request) -> bytes:
    """The raw body, refused once it outgrows the limit (the guard already refused a declared
    Content-Length past it); the rest is read and dropped, so the client sees the 413."""
    limit = get_state(request).config.max_body_bytes
    chunks: list[bytes] = []
    size = 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            chunks.clear()
            async for _ in stream:
                pass
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_request(request: Request, model: type[M]) -> M:
    """The body as ``model``; records its size in ``request.state.body_bytes``. A body declared
    heavy is read through the heavy gate (heavy.py)."""
    state = get_state(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > HEAVY_BYTES:
        raw = await state.heavy_gate.run(read_body(request))
    else:
        raw = await read_body(request)
    request.state.body_bytes = len(raw)
    if len(raw) <= HEAVY_BYTES:
        return validate_json(model, raw)
    return await state.off_loop(request, lambda: validate_json(model, raw))


def validate_json(model: type[M], raw: bytes) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more errors)" if exc.error_count() > 1 else ""
        if first["type"] == "json_invalid":
            raise APIError.invalid(f"request body is not valid JSON: {first['msg']}") from exc
        if not loc:
            raise APIError.invalid(f"request body: {first['msg']}{more}") from exc
        raise APIError.invalid(f"{loc}: {first['msg']}{more}", param=loc) from exc
