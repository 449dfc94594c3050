"""Responses-API request (instructions, input items, tools) → the internal request.

The server is stateless: everything the model should see must be in ``input``.
"""

from __future__ import annotations

import json
from typing import Any

from freetoken.server.errors import APIError
from freetoken.server.internal import ChatRequest, ResponseFormat, ToolChoice, ToolSpec, effort_level
from freetoken.server.openai.convert import text_of, tool_call_dict
from freetoken.server.openai.protocol import ResponsesItem, ResponsesRequest, ResponsesTool

CUSTOM_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The raw input for this tool."}},
    "required": ["input"],
}


def to_internal(body: ResponsesRequest, earlier: list[dict[str, Any]] | None = None) -> ChatRequest:
    """``earlier``: the conversation of ``previous_response_id`` (``responses_store.py``)."""
    if body.conversation:
        raise APIError.invalid(
            "conversation objects are not supported: send the conversation in `input`, or continue a "
            "stored response with previous_response_id",
            param="conversation",
        )
    extra = body.model_extra or {}
    if extra.get("top_logprobs") or "message.output_text.logprobs" in (extra.get("include") or []):
        raise APIError.invalid("logprobs are not supported on /v1/responses yet (use /v1/chat/completions)",
                               param="top_logprobs")  # fmt: skip
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    messages += earlier or []
    if isinstance(body.input, str):
        items = [ResponsesItem(type="message", role="user", content=body.input)]
    else:
        items = body.input
    _Items(messages).add_all(items)
    tools = [t for t in (_tool(d, i) for i, d in enumerate(body.tools or [])) if t is not None]
    reasoning = effort = None
    if body.reasoning is not None and body.reasoning.effort is not None:
        reasoning = body.reasoning.effort not in ("none",)
        effort = effort_level(body.reasoning.effort, "reasoning.effort")
    return ChatRequest(
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        max_tokens=body.max_output_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        reasoning=reasoning,
        reasoning_effort=effort,
        response_format=text_format(body.text),
    )


def text_format(text: dict[str, Any] | None) -> ResponseFormat | None:
    """``text.format``: {"type": "text" | "json_object" | "json_schema", "name", "schema", "strict"}."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        return ResponseFormat("json_schema", fmt["schema"], str(fmt.get("name") or ""))
    raise APIError.invalid(
        "text.format must be {type: text}, {type: json_object} or {type: json_schema, schema: {...}}",
        param="text.format",
    )


def _tool(d: ResponsesTool, i: int) -> ToolSpec | None:
    if d.type not in ("function", "custom"):
        return None  # hosted tools (web_search, file_search, …) are not available on this server
    if not d.name:
        raise APIError.invalid(f"tools[{i}]: a {d.type} tool needs a name", param=f"tools.{i}.name")
    if d.type == "function":
        return ToolSpec(d.name, d.description or "", d.parameters or {"type": "object", "properties": {}})
    desc = d.description or ""
    fmt = d.format
    syntax = None
    if fmt is not None and fmt.type == "grammar" and fmt.definition:
        if fmt.syntax not in ("lark", "regex"):
            raise APIError.invalid(
                f"tools[{i}]: grammar syntax must be lark or regex, got {fmt.syntax!r}", param=f"tools.{i}.format"
            )
        syntax = fmt.syntax
        desc += f"\n\nThe input must follow this {fmt.syntax} grammar:\n{fmt.definition}"
    definition = fmt.definition or "" if fmt is not None else ""
    return ToolSpec(d.name, desc.strip(), CUSTOM_INPUT_SCHEMA, custom=True, grammar_syntax=syntax,
                    grammar_definition=definition if syntax else "")  # fmt: skip


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice:
    if choice is None or choice == "auto":
        return ToolChoice("auto")
    if choice in ("none", "required"):
        return ToolChoice(choice)  # type: ignore[arg-type]
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
        return ToolChoice("named", str(choice["name"]))
    if isinstance(choice, dict):
        return ToolChoice("auto")  # allowed_tools, hosted tools: no narrower behaviour available
    raise APIError.invalid(f"unsupported tool_choice {choice!r}", param="tool_choice")


class _Items:
    """Folds input items into template messages (calls join the assistant turn before them)."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.reasoning: list[str] = []  # reasoning items waiting for their assistant turn

    def add_all(self, items: list[ResponsesItem]) -> None:
        for i, item in enumerate(items):
            self.add(item, i)

    def add(self, item: ResponsesItem, i: int) -> None:
        kind = item.type or ("message" if item.role is not None else None)
        where = f"input.{i}"
        if kind == "message":
            role = item.role
            text = text_of(item.content, f"{where}.content")
            if role in ("system", "developer"):
                self.messages.append({"role": "system", "content": text})
            elif role == "user":
                self.messages.append({"role": "user", "content": text})
            elif role == "assistant":
                self._assistant(new=True)["content"] = text
            else:
                raise APIError.invalid(f"input[{i}]: unknown role {role!r}", param=f"{where}.role")
        elif kind == "reasoning":
            text = text_of(item.content or item.summary or [], f"{where}.content")
            if text:  # encrypted-only reasoning carries nothing this model can read
                self.reasoning.append(text)
        elif kind in ("function_call", "custom_tool_call"):
            call_id, name = item.call_id, item.name
            if call_id is None or name is None:
                raise APIError.invalid(f"input[{i}]: {kind} needs call_id and name", param=where)
            if kind == "function_call":
                args: str | dict[str, Any] = item.arguments if item.arguments is not None else ""
            else:
                args = json.dumps({"input": item.input or ""}, ensure_ascii=False)
            self._assistant(new=False).setdefault("tool_calls", []).append(tool_call_dict(call_id, name, args))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if item.call_id is None:
                raise APIError.invalid(f"input[{i}]: {kind} needs call_id", param=where)
            output = text_of(item.output if item.output is not None else "", f"{where}.output", tool_result=True)
            self.messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        elif kind == "item_reference":
            raise APIError.invalid(
                f"input[{i}]: item_reference needs stored responses, which this server "
                "does not keep; send the item itself",
                param=where,
            )
        else:
            raise APIError.invalid(f"input[{i}]: unsupported input item type {kind!r}", param=f"{where}.type")

    def _assistant(self, new: bool) -> dict[str, Any]:
        """The assistant turn to write into: a fresh one, or the last one if calls may join it."""
        last = self.messages[-1] if self.messages else None
        if not new and last is not None and last["role"] == "assistant" and not self.reasoning:
            return last
        msg: dict[str, Any] = {"role": "assistant", "content": ""}
        if self.reasoning:
            msg["reasoning_content"] = "\n".join(self.reasoning)
            self.reasoning = []
        self.messages.append(msg)
        return msg
