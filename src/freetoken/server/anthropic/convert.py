"""Anthropic Messages request → the internal request."""

from __future__ import annotations

import re
from typing import Any

from freetoken.server.anthropic.protocol import ContentBlock, Conversation, Message, MessagesRequest, Part
from freetoken.server.errors import APIError
from freetoken.server.internal import ChatRequest, ResponseFormat, ToolChoice, ToolSpec, effort_level
from freetoken.server.openai.convert import MEDIA_PARTS, media_placeholder, refuse_media, tool_call_dict

# Claude Code puts a per-request checksum (cch=…) in a billing line at the top of the system
# prompt; left alone it changes the very first tokens and defeats the prefix cache.
_BILLING = re.compile(r"^(x-anthropic-billing-header:[^\n]*?\bcch=)[^;\s]*", re.MULTILINE)


def normalise_billing_header(text: str) -> str:
    return _BILLING.sub(r"\g<1>00000", text)


def to_internal(body: Conversation) -> ChatRequest:
    system = _system_text(body.system)
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(body.messages):
        if m.role == "system":  # folded into the system prompt
            system = "\n\n".join(s for s in (system, _plain_text(m.content, f"messages.{i}.content")) if s)
        elif m.role == "user":
            messages.extend(_user(m, i))
        else:
            messages.append(_assistant(m, i))
    if not messages:
        raise APIError.invalid("messages: at least one user message is required", param="messages")
    if system:
        messages.insert(0, {"role": "system", "content": normalise_billing_header(system)})
    tools = [ToolSpec(t.name, t.description or "", t.input_schema) for t in body.tools or [] if t.input_schema]
    choice, parallel = ToolChoice("auto"), True
    if body.tool_choice is not None:
        tc = body.tool_choice
        mode = {"auto": "auto", "any": "required", "none": "none", "tool": "named"}[tc.type]
        choice = ToolChoice(mode, tc.name)  # type: ignore[arg-type]
        parallel = not tc.disable_parallel_tool_use
    reasoning = None if body.thinking is None else body.thinking.type != "disabled"
    req = ChatRequest(
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        reasoning=reasoning,
        reasoning_effort=effort_level(body.output_config and body.output_config.effort, "output_config.effort"),
    )
    if isinstance(body, MessagesRequest):
        req.max_tokens = body.max_tokens
        req.stop = list(body.stop_sequences or [])
        req.temperature = 1.0 if body.temperature is None else body.temperature
        req.top_p = 1.0 if body.top_p is None else body.top_p
        req.top_k = body.top_k or 0
        req.ignore_eos = body.ignore_eos
        if body.output_format is not None:
            req.response_format = ResponseFormat("json_schema", body.output_format.schema_)
    return req


def _system_text(system: str | list[ContentBlock] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return _plain_text(system, "system")


def _plain_text(content: str | list[ContentBlock], where: str) -> str:
    if isinstance(content, str):
        return content
    out: list[str] = []
    for i, b in enumerate(content):
        if b.type != "text" or b.text is None:
            raise APIError.invalid(
                f"{where}[{i}]: only text blocks are allowed here, got {b.type!r}", param=f"{where}.{i}"
            )
        out.append(b.text)
    return "\n".join(out)


def _user(m: Message, i: int) -> list[dict[str, Any]]:
    """Tool results become tool messages (first, as templates expect), the rest one user message."""
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}]
    tools: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, b in enumerate(m.content):
        where = f"messages.{i}.content.{j}"
        if b.type == "text":
            texts.append(b.text or "")
        elif b.type == "tool_result":
            if not b.tool_use_id:
                raise APIError.invalid(f"{where}: tool_result needs tool_use_id", param=where)
            text = _result_text(b.content, where)
            if b.is_error:
                text = f"Error: {text}" if text else "Error"
            tools.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": text})
        elif b.type in MEDIA_PARTS:
            raise refuse_media(b.type, where)
        else:
            raise APIError.invalid(
                f"{where}: content block type {b.type!r} is not supported in user messages", param=where
            )
    if texts or not tools:
        tools.append({"role": "user", "content": "\n".join(texts)})
    return tools


def _result_text(content: str | list[Part] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    out = []
    for k, part in enumerate(content):
        if part.type == "text":
            out.append(part.text or "")
        elif part.type in MEDIA_PARTS:
            out.append(media_placeholder(part.type))
        else:
            raise APIError.invalid(
                f"{where}.content[{k}]: tool result part {part.type!r} is not supported",
                param=f"{where}.content.{k}",
            )
    return "\n".join(out)


def _assistant(m: Message, i: int) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": ""}
    if isinstance(m.content, str):
        out["content"] = m.content
        return out
    texts, thinking, calls = [], [], []
    for j, b in enumerate(m.content):
        if b.type == "text":
            texts.append(b.text or "")
        elif b.type == "thinking":
            thinking.append(b.thinking or "")
        elif b.type == "redacted_thinking":
            continue  # opaque: nothing the model could read
        elif b.type == "tool_use":
            if not b.id or not b.name:
                raise APIError.invalid(
                    f"messages[{i}].content[{j}]: tool_use needs id and name",
                    param=f"messages.{i}.content.{j}",
                )
            calls.append(tool_call_dict(b.id, b.name, b.input if isinstance(b.input, dict) else {}))
        else:
            raise APIError.invalid(
                f"messages[{i}].content[{j}]: block type {b.type!r} is not supported",
                param=f"messages.{i}.content.{j}",
            )
    out["content"] = "".join(texts)
    if thinking:
        out["reasoning_content"] = "\n".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out
