"""What the engine hands back: incremental per-step outputs and final results."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    """One step's news for one request (streaming delta) — or the end of it."""

    request_id: str
    new_token_ids: list[int]
    new_text: str  # text safe to emit now (complete UTF-8, not a possible stop-string prefix)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None
    """Per new token, when asked: (token, its logprob, [(alternative, logprob), ...] best first)."""


@dataclass
class CompletionResult:
    """``LLM.generate`` result for one prompt."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
