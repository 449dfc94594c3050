"""``POST /v1/chat/completions``: streaming and not, tools, reasoning in ``reasoning_content``."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from freetoken.chat import events as ev
from freetoken.server.body import parse_request
from freetoken.server.errors import APIError
from freetoken.server.generation import Generation, Prepared, until_finish
from freetoken.server.internal import (
    ChatRequest,
    Completion,
    Finish,
    ResponseFormat,
    TokenLogprobs,
    ToolChoice,
    ToolSpec,
    effort_level,
)
from freetoken.server.openai.convert import text_of, tool_call_dict
from freetoken.server.openai.protocol import ChatCompletionRequest, ChatMessage, NamedToolChoice
from freetoken.server.openai.sampling import logprobs_content, refuse_unsupported, sampler_fields, top_logprobs
from freetoken.server.sse import sse, sse_response, unless_disconnected
from freetoken.server.state import get_state

_FINISH = {
    "stop": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "abort": "stop",
}


def to_internal(body: ChatCompletionRequest) -> ChatRequest:
    if body.n != 1:
        raise APIError.invalid("only n=1 is supported", param="n")
    refuse_unsupported(body)
    messages = [_message(m, i) for i, m in enumerate(body.messages)]
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        tool_choice = ToolChoice("named", choice.function.name)
    else:
        tool_choice = ToolChoice(choice or "auto")
    tools = [
        ToolSpec(
            t.function.name,
            t.function.description or "",
            t.function.parameters or {"type": "object", "properties": {}},
        )
        for t in body.tools or []
    ]
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    kwargs = dict(body.chat_template_kwargs or {})
    reasoning = kwargs.pop("enable_thinking", None)
    if reasoning is None and body.reasoning_effort is not None:
        reasoning = body.reasoning_effort != "none"
    if "reasoning_effort" in kwargs:  # the template kwarg itself: checked like the field
        effort = effort_level(kwargs.pop("reasoning_effort"), "chat_template_kwargs.reasoning_effort")
    else:
        effort = effort_level(body.reasoning_effort, "reasoning_effort")
    return ChatRequest(
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        max_tokens=max_tokens,
        **sampler_fields(body),
        logprobs=top_logprobs(body.logprobs, body.top_logprobs),
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        stop=stop,
        reasoning=reasoning,
        reasoning_effort=effort,
        template_kwargs=kwargs,
        response_format=_response_format(body),
    )


def _response_format(body: ChatCompletionRequest) -> ResponseFormat | None:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat("json_object")
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError.invalid(
            "response_format json_schema needs json_schema.schema", param="response_format.json_schema"
        )
    return ResponseFormat("json_schema", fmt.json_schema.schema_, fmt.json_schema.name)


def _message(m: ChatMessage, i: int) -> dict[str, Any]:
    where = f"messages.{i}.content"
    if m.role in ("system", "developer"):
        return {"role": "system", "content": text_of(m.content, where)}
    if m.role == "user":
        return {"role": "user", "content": text_of(m.content, where)}
    if m.role == "tool":
        if not m.tool_call_id:
            raise APIError.invalid(f"messages[{i}]: a tool message needs tool_call_id", param=f"messages.{i}")
        return {"role": "tool", "content": text_of(m.content, where, tool_result=True), "tool_call_id": m.tool_call_id}
    out: dict[str, Any] = {"role": "assistant", "content": text_of(m.content, where)}
    reasoning = m.reasoning_content or m.reasoning
    if reasoning:
        out["reasoning_content"] = reasoning
    if m.tool_calls:
        out["tool_calls"] = [tool_call_dict(tc.id, tc.function.name, tc.function.arguments) for tc in m.tool_calls]
    return out


async def create_chat_completion(request: Request) -> Response:
    state = get_state(request)
    body = await parse_request(request, ChatCompletionRequest)
    model = state.served_name(body.model)
    gen = state.generation()
    prep = await state.off_loop(request, lambda: gen.prepare(to_internal(body)))
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    if not body.stream:
        done = await unless_disconnected(request, gen.complete(prep, rid))
        lp = logprobs_content(gen.engine.tokenizer, done.logprobs) if prep.params.logprobs is not None else None
        return JSONResponse(_completion_body(rid, model, done, lp))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = gen.stream(prep, rid)
    first = await unless_disconnected(request, gen.first_event(events))
    frames = _frames(gen, prep, rid, model, first, events, include_usage)
    return sse_response(frames, state.config.keepalive_s)


def _completion_body(rid: str, model: str, done: Completion, logprobs: list[Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": done.content}
    if done.reasoning:
        message["reasoning_content"] = done.reasoning
    if done.tool_calls:
        message["content"] = done.content or None
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in done.tool_calls
        ]
    f = done.finish
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": _FINISH[f.reason],
            }
        ],
        "usage": _usage(f),
    }


def _usage(f: Finish) -> dict[str, Any]:
    return {
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": f.reasoning_tokens},
    }


async def _frames(
    gen: Generation,
    prep: Prepared,
    rid: str,
    model: str,
    first: Any,
    events: AsyncGenerator[Any, None],
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: list[Any] | None = None) -> bytes:
        lp = None if logprobs is None else {"content": logprobs}
        c: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
        }
        if include_usage:
            c["usage"] = None
        return sse(c)

    yield chunk({"role": "assistant", "content": ""})
    try:
        async with aclosing(until_finish(first, events)) as stream:
            async for e in stream:
                if isinstance(e, TokenLogprobs):  # its own chunk: tokens and parsed text do not align
                    yield chunk({}, logprobs=logprobs_content(gen.engine.tokenizer, e.entries))
                    continue
                if isinstance(e, Finish):
                    yield chunk({}, _FINISH[e.reason])
                    if include_usage:
                        yield sse(
                            {
                                "id": rid,
                                "object": "chat.completion.chunk",
                                "created": created,
                                "model": model,
                                "choices": [],
                                "usage": _usage(e),
                            }
                        )
                    break
                delta = _delta(e)
                if delta is not None:
                    yield chunk(delta)
    except APIError as err:
        yield sse(err.body("openai"))
    yield sse("[DONE]")


def _delta(e: Any) -> dict[str, Any] | None:
    if isinstance(e, ev.ContentDelta):
        return {"content": e.text} if e.text else None
    if isinstance(e, ev.ReasoningDelta):
        return {"reasoning_content": e.text} if e.text else None
    if isinstance(e, ev.ToolCallStart):
        return {
            "tool_calls": [
                {
                    "index": e.index,
                    "id": e.id,
                    "type": "function",
                    "function": {"name": e.name, "arguments": ""},
                }
            ]
        }
    if isinstance(e, ev.ToolCallArgsDelta):
        return {"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]} if e.text else None
    return None
