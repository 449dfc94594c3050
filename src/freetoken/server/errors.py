"""Errors in each API's own shape.

Handlers raise ``APIError`` with a protocol-neutral ``kind``; the app renders it as OpenAI's
``{"error": {...}}`` or Anthropic's ``{"type": "error", "error": {...}}`` depending on the route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal[
    "invalid_request",
    "authentication",
    "forbidden",
    "not_found",
    "context_length",
    "too_large",
    "unsupported_media_type",
    "overloaded",
    "server_error",
    "unavailable",
]

# kind -> (OpenAI status, OpenAI type, Anthropic status, Anthropic type)
_SHAPES: dict[str, tuple[int, str, int, str]] = {
    "invalid_request": (400, "invalid_request_error", 400, "invalid_request_error"),
    "context_length": (400, "invalid_request_error", 400, "invalid_request_error"),
    "too_large": (413, "invalid_request_error", 413, "request_too_large"),
    "authentication": (401, "authentication_error", 401, "authentication_error"),
    "forbidden": (403, "permission_error", 403, "permission_error"),
    "unsupported_media_type": (415, "invalid_request_error", 415, "invalid_request_error"),
    "not_found": (404, "not_found_error", 404, "not_found_error"),
    "overloaded": (429, "rate_limit_error", 529, "overloaded_error"),
    "server_error": (500, "server_error", 500, "api_error"),
    "unavailable": (503, "server_error", 503, "api_error"),
}

Flavor = Literal["openai", "anthropic"]


@dataclass
class APIError(Exception):
    kind: Kind
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    @classmethod
    def invalid(cls, message: str, param: str | None = None) -> APIError:
        return cls("invalid_request", message, param=param)

    def status(self, flavor: Flavor) -> int:
        shape = _SHAPES[self.kind]
        return shape[0] if flavor == "openai" else shape[2]

    def body(self, flavor: Flavor) -> dict[str, Any]:
        shape = _SHAPES[self.kind]
        if flavor == "anthropic":
            return {"type": "error", "error": {"type": shape[3], "message": self.message}}
        code = self.code
        if code is None and self.kind == "context_length":
            code = "context_length_exceeded"
        return {"error": {"message": self.message, "type": shape[1], "param": self.param, "code": code}}


def flavor_for_path(path: str) -> Flavor:
    """Anthropic routes answer in Anthropic's shape; everything else in OpenAI's."""
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def from_engine_error(exc: BaseException) -> APIError:
    """Map an engine exception to the error a client should see."""
    from freetoken.engine.errors import (
        EngineDeadError,
        InputError,
        KVBusyError,
        PromptTooLongError,
        QueueFullError,
        RequestFailedError,
        ShuttingDownError,
    )

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, PromptTooLongError):
        return context_overflow(exc.prompt_tokens, exc.max_model_len - 1)
    if isinstance(exc, InputError):
        return APIError.invalid(str(exc))
    if isinstance(exc, QueueFullError):
        return APIError("overloaded", "the server is overloaded: too many queued requests; retry later")
    if isinstance(exc, ShuttingDownError | KVBusyError):
        return APIError("unavailable", str(exc))
    if isinstance(exc, RequestFailedError):
        return APIError("server_error", str(exc))
    if isinstance(exc, EngineDeadError):
        return APIError("server_error", f"the engine has stopped: {exc}")
    return APIError("server_error", f"internal error: {type(exc).__name__}: {exc}")


def too_large(limit: int) -> APIError:
    return APIError("too_large", f"request body is larger than {limit} bytes (ft serve --max-body-bytes)")


def context_overflow(prompt_tokens: int, maximum: int, counted: bool = True) -> APIError:
    """``counted=False``: ``prompt_tokens`` is a lower bound from the prompt's length (not tokenised)."""
    # Wording clients match on: Anthropic's "prompt is too long: N tokens > M maximum" and
    # OpenAI's "maximum context length" phrase (with code context_length_exceeded).
    how = "" if counted else " (at least: the prompt is too long to be worth tokenising)"
    return APIError(
        "context_length",
        f"prompt is too long: {prompt_tokens} tokens > {maximum} maximum{how}. This model's maximum context "
        f"length is {maximum + 1} tokens and at least one token must be left for the reply.",
        param="messages",
    )
