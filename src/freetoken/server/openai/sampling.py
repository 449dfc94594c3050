"""The OpenAI sampling fields: which reach the sampler, which are refused (never silently ignored),
and logprobs in OpenAI's shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from freetoken.server.errors import APIError

# Fields clients send that this server cannot honour, with the value that means "off".
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "typical_p": (None, 1, 1.0),
    "top_a": (None, 0, 0.0),
    "tfs_z": (None, 1, 1.0),
    "mirostat": (None, 0),
    "prediction": (None,),
    "audio": (None,),
}


def refuse_unsupported(body: BaseModel) -> None:
    """A sampling field we cannot honour is a 400 naming it."""
    extra = body.model_extra or {}
    for name, off in _UNSUPPORTED.items():
        if name in extra and extra[name] not in off:
            raise APIError.invalid(f"{name} is not supported by this server", param=name)


def sampler_fields(body: Any) -> dict[str, Any]:
    """The sampler's settings an OpenAI body (chat or legacy completions) gives, with OpenAI's defaults for the
    unset ones: temperature 1, top-p 1, no top-k / min-p, no penalties."""
    return {
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_k": body.top_k or 0,
        "min_p": body.min_p or 0.0,
        "presence_penalty": body.presence_penalty or 0.0,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
    }


def top_logprobs(logprobs: bool | None, top: int | None) -> int | None:
    """OpenAI's pair (logprobs: bool, top_logprobs: int) as the sampler's count (None: no logprobs)."""
    if top is not None and not logprobs:
        raise APIError.invalid("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if logprobs else None


def logprobs_content(tokenizer: Any, entries: list[tuple[int, float, list[tuple[int, float]]]]) -> list[dict[str, Any]]:
    """``choices[].logprobs.content`` items: each token's text, bytes, logprob and its alternatives."""

    def item(token: int, lp: float) -> dict[str, Any]:
        text = tokenizer.decode([token], skip_special_tokens=False) if tokenizer is not None else str(token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8", "replace"))}

    return [{**item(t, lp), "top_logprobs": [item(a, alp) for a, alp in top]} for t, lp, top in entries]
