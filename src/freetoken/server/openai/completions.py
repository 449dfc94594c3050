"""``POST /v1/completions``: the legacy text route (evaluation harnesses score prompts with ``echo`` + ``logprobs``).
A prompt string or token ids; streamed or not; ``stop`` (on the raw text: there is no reasoning or tool markup
to spare here), ``seed``, ``logprobs`` in the legacy shape, ``echo`` with the prompt's own logprobs
(``AsyncLLM.prompt_logprobs``); ``max_tokens: 0`` with ``echo`` scores the prompt without generating."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from freetoken.runner.sampling_params import SamplingParams
from freetoken.server.body import parse_request
from freetoken.server.errors import APIError, context_overflow, from_engine_error
from freetoken.server.generation import Generation
from freetoken.server.openai.protocol import CompletionRequest
from freetoken.server.openai.sampling import refuse_unsupported, sampler_fields
from freetoken.server.openai.tokenize import prompt_token_ids
from freetoken.server.sse import sse, sse_response, unless_disconnected
from freetoken.server.state import get_state

Entry = tuple[int, float | None, list[tuple[int, float]]]  # a token, its logprob (None: the first), alternatives


@dataclass
class Piece:
    """Text (and its tokens' logprobs) to send; ``finish`` on the last one."""

    text: str
    entries: list[Entry] = field(default_factory=list)
    finish: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _params(body: CompletionRequest, max_tokens: int) -> SamplingParams:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            **sampler_fields(body),
            logprobs=body.logprobs,
            stop=stop,
            seed=body.seed,
            ignore_eos=body.ignore_eos,
            skip_special_tokens=body.skip_special_tokens,
        )
    except ValueError as exc:
        raise APIError.invalid(str(exc)) from exc


def _check(body: CompletionRequest) -> None:
    if body.n != 1:
        raise APIError.invalid("only n=1 is supported", param="n")
    if body.suffix:
        raise APIError.invalid("suffix is not supported by this server", param="suffix")
    refuse_unsupported(body)
    if body.max_tokens is not None and (body.max_tokens < 0 or (body.max_tokens == 0 and not body.echo)):
        raise APIError.invalid("max_tokens must be >= 1 (0 only with echo, to score the prompt)", param="max_tokens")


async def create_completion(request: Request) -> Response:
    state = get_state(request)
    body = await parse_request(request, CompletionRequest)
    _check(body)
    model = state.served_name(body.model)
    gen = state.generation()
    ids = await state.off_loop(request, lambda: prompt_token_ids(gen, body.prompt))
    if not ids:
        raise APIError.invalid("the prompt is empty", param="prompt")
    left = gen.engine.max_model_len - len(ids)
    if left < 1:
        raise context_overflow(len(ids), gen.engine.max_model_len - 1)
    wanted = left if body.max_tokens is None else min(body.max_tokens, left)
    params = _params(body, max(wanted, 1))
    rid = f"cmpl-{uuid.uuid4().hex}"
    pieces = _pieces(gen, body, ids, params if wanted else None, rid)
    if not body.stream:
        done = await unless_disconnected(request, _collect(pieces))
        return JSONResponse(_body(gen, rid, model, [done], body.logprobs is not None, done))
    first = await unless_disconnected(request, pieces.__anext__())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    frames = _frames(gen, rid, model, first, pieces, body.logprobs is not None, include_usage)
    return sse_response(frames, state.config.keepalive_s)


async def _pieces(
    gen: Generation, body: CompletionRequest, ids: list[int], params: SamplingParams | None, rid: str
) -> AsyncGenerator[Piece, None]:
    """The echoed prompt (with its logprobs when asked), then the generated text, the last piece finishing."""
    tok = gen.engine.tokenizer
    if body.echo:
        entries: list[Entry] = []
        if body.logprobs is not None:
            try:
                scored = await gen.engine.prompt_logprobs(ids, body.logprobs)
            except Exception as exc:
                raise from_engine_error(exc) from exc
            entries = [(ids[0], None, []), *[(t, lp, top) for t, (lp, top) in zip(ids[1:], scored)]]
        text = body.prompt if isinstance(body.prompt, str) else tok.decode(ids, skip_special_tokens=False)
        if isinstance(body.prompt, list) and len(body.prompt) == 1 and isinstance(body.prompt[0], str):
            text = body.prompt[0]
        yield Piece(cast(str, text), entries, None if params else "length", len(ids))
    if params is None:
        return
    gen.metrics.request_started()
    start, produced = time.perf_counter(), 0
    try:
        stream = cast(AsyncGenerator[Any, None], gen.engine.generate(ids, params, rid))
        async with aclosing(stream) as outputs:
            async for out in outputs:
                if produced == 0:
                    gen.metrics.first_token(time.perf_counter() - start)
                produced += len(out.new_token_ids)
                if out.finished and out.finish_reason == "error":
                    raise APIError("server_error", f"generation failed: {out.error or 'engine error'}")
                lps: list[Entry] = [(t, lp, top) for t, lp, top in out.logprobs or []]
                finish = None
                if out.finished:
                    finish = "length" if out.finish_reason == "length" else "stop"
                yield Piece(out.new_text, lps, finish, out.prompt_tokens or len(ids),
                            out.completion_tokens or produced)  # fmt: skip
                if out.finished:
                    return
    except APIError:
        raise
    except Exception as exc:
        raise from_engine_error(exc) from exc
    finally:
        gen.metrics.request_finished(produced, time.perf_counter() - start)


async def _collect(pieces: AsyncGenerator[Piece, None]) -> Piece:
    whole = Piece("")
    async with aclosing(pieces) as stream:
        async for p in stream:
            whole.text += p.text
            whole.entries += p.entries
            whole.finish = p.finish or whole.finish
            whole.prompt_tokens = p.prompt_tokens or whole.prompt_tokens
            whole.completion_tokens = p.completion_tokens or whole.completion_tokens
    return whole


def _legacy_logprobs(gen: Generation, entries: list[Entry], offset: int) -> dict[str, Any]:
    """OpenAI's legacy logprobs: tokens, token_logprobs, top_logprobs (text → logprob), text_offset."""
    tok = gen.engine.tokenizer

    def text(t: int) -> str:
        return str(tok.decode([t], skip_special_tokens=False)) if tok is not None else str(t)

    tokens = [text(t) for t, _, _ in entries]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    tops = [None if lp is None else {text(a): alp for a, alp in top} for _, lp, top in entries]
    return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries], "top_logprobs": tops,
            "text_offset": offsets}  # fmt: skip


def _usage(p: Piece) -> dict[str, int]:
    return {"prompt_tokens": p.prompt_tokens, "completion_tokens": p.completion_tokens,
            "total_tokens": p.prompt_tokens + p.completion_tokens}  # fmt: skip


def _body(gen: Generation, rid: str, model: str, pieces: list[Piece], logprobs: bool, done: Piece,
          offset: int = 0, obj_usage: bool = True) -> dict[str, Any]:  # fmt: skip
    p = pieces[0]
    choice = {"index": 0, "text": p.text, "logprobs": _legacy_logprobs(gen, p.entries, offset) if logprobs else None,
              "finish_reason": p.finish}  # fmt: skip
    out: dict[str, Any] = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
                           "choices": [choice]}  # fmt: skip
    if obj_usage:
        out["usage"] = _usage(done)
    return out


async def _frames(
    gen: Generation,
    rid: str,
    model: str,
    first: Piece,
    pieces: AsyncGenerator[Piece, None],
    logprobs: bool,
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    offset, last = 0, first
    try:
        async with aclosing(pieces) as stream:
            p: Piece | None = first
            while p is not None:
                chunk = _body(gen, rid, model, [p], logprobs, p, offset, obj_usage=False)
                if include_usage:
                    chunk["usage"] = None
                yield sse(chunk)
                offset += len(p.text)
                last = p
                p = None if p.finish else await anext(stream, None)
    except APIError as err:
        yield sse(err.body("openai"))
    else:
        if include_usage:
            yield sse({"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
                       "choices": [], "usage": _usage(last)})  # fmt: skip
    yield sse("[DONE]")
