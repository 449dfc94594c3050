"""Engine errors. Input errors are the caller's fault and never harm other requests."""

from __future__ import annotations

from freetoken.errors import FreeTokenError, InputError

__all__ = ["EngineDeadError", "FreeTokenError", "InputError", "KVBusyError", "PromptTooLongError", "QueueFullError"]


class PromptTooLongError(InputError):
    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"prompt is too long: {prompt_tokens} tokens > {max_model_len - 1} maximum "
            f"(context length {max_model_len} must leave room for at least one generated token)"
        )


class QueueFullError(FreeTokenError):
    """The waiting queue is full; try again later."""


class KVBusyError(FreeTokenError):
    """The work fits the KV pool but not its free pages now (running requests hold them); try again later."""


class EngineDeadError(FreeTokenError):
    """The engine thread died; the server answers 5xx."""


class RequestFailedError(FreeTokenError):
    """The engine could not finish this request (a failed step); the engine itself serves on."""


class ShuttingDownError(FreeTokenError):
    """The server is shutting down: this request was refused, or cut at the shutdown timeout."""
