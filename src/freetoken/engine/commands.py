"""What the frontend asks of the engine thread. Commands queue up and run between steps (a safe point);
a command with a future answers through it."""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Any

from freetoken.runner.constraint import TokenConstraint
from freetoken.runner.sampling_params import SamplingParams


@dataclass(frozen=True)
class Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    accepted: cf.Future[None]
    """Resolved once the engine queued the request, or failed with why it refused it."""
    constraint: TokenConstraint | None = None
    """``params.grammar`` compiled (on the frontend's side: compiling never holds up the engine thread)."""


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class FailAll:
    """Finish every request; each stream raises this error (the server's shutdown timeout ran out)."""

    error: Exception


@dataclass(frozen=True)
class Check:
    done: cf.Future[None]
    """Resolved after the caches' integrity checks passed, or failed with the violation."""


@dataclass(frozen=True)
class SetMemory:
    """A VRAM budget set by hand (``POST /v1/engine/memory``, ``ft ctl memory``)."""

    budget_gib: float
    reason: str
    done: cf.Future[dict[str, Any]]
    """Resolved with the memory split after the resize, or failed with why the budget was refused."""


@dataclass(frozen=True)
class Score:
    """The prompt's own logprobs (``/v1/completions`` with ``echo``): each token after the first under the tokens
    before it, with the ``top`` most likely alternatives (``scoring.prompt_logprobs``)."""

    token_ids: list[int]
    top: int
    done: cf.Future[list[tuple[float, list[tuple[int, float]]]]]


@dataclass(frozen=True)
class FreeMemory:
    """The VRAM watcher's reading of the device's free memory (the engine shrinks or grows on it)."""

    free_bytes: int


@dataclass(frozen=True)
class Wake:
    """Nothing to do: makes an idle engine thread look at its stop flag."""


Command = Add | Abort | FailAll | Check | SetMemory | Score | FreeMemory | Wake
