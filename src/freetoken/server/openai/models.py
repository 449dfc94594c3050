"""``GET /v1/models``: one entry per served name, readable by OpenAI and Anthropic clients alike."""

from __future__ import annotations

import datetime as dt

from fastapi import Request
from fastapi.responses import JSONResponse

from freetoken.server.state import ServerState, get_state


def _entry(state: ServerState, name: str) -> dict[str, object]:
    created = int(state.metrics.started_at)
    length = state.engine.max_model_len if state.engine.state == "ready" else None
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "freetoken",
        "context_length": length,
        "max_model_len": length,
        "capabilities": state.capabilities() if state.engine.state == "ready" else None,
        # Anthropic's model-list fields, so `anthropic.Anthropic().models.list()` works too.
        "type": "model",
        "display_name": name,
        "created_at": dt.datetime.fromtimestamp(created, dt.timezone.utc).isoformat().replace("+00:00", "Z"),
    }


async def list_models(request: Request) -> JSONResponse:
    state = get_state(request)
    data = [_entry(state, n) for n in state.model_names]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"],
            "last_id": data[-1]["id"],
        }
    )


async def get_model(request: Request, model_id: str) -> JSONResponse:
    """A served name answers as itself; any other name (a client configured for a cloud model) is answered by the
    loaded model under its real id, as generation answers it."""
    state = get_state(request)
    return JSONResponse(_entry(state, model_id if model_id in state.model_names else state.model_names[0]))
