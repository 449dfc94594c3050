"""The requests of ``ft bench structured``: forced tool calls through each API and JSON answers, each
with the check its answer must pass (right tool, arguments valid against its schema, no markup)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"name": "get_weather", "description": "Get the current weather for a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "calculator", "description": "Evaluate an arithmetic expression",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}},
    {"name": "read_file", "description": "Read a file from disk",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "set_alarm", "description": "Set an alarm",
     "parameters": {"type": "object", "required": ["hour", "minute"], "properties": {
         "hour": {"type": "integer", "minimum": 0, "maximum": 23},
         "minute": {"type": "integer", "minimum": 0, "maximum": 59},
         "repeat": {"type": "string", "enum": ["never", "daily", "weekdays"]}}}},
    {"name": "set_volume", "description": "Set the speaker volume",
     "parameters": {"type": "object", "properties": {"level": {"type": "integer", "minimum": 0, "maximum": 10},
                                                     "mute": {"type": "boolean"}}, "required": ["level"]}},
]  # fmt: skip
# Arguments and answers of bounded length: what a random model can finish (it never closes a free string).
BOUNDED_TOOLS = ("set_alarm", "set_volume")
BOUNDED_SCHEMAS = (0, 2, 3)
PROMPTS = [
    "What's the weather in Oslo?",
    "Compute (12 + 7) * 30.",
    "Show me what is in notes/todo.txt",
    "Wake me up at 6:30 every weekday.",
    "Hello! Who are you?",
    "How many items are in this list: cat, dog, sun?",
    "Is it raining in Lima right now?",
    "What is 345 * 12?",
]
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "required": ["name", "age"], "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150}}},
    {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}},
    {"type": "object", "required": ["items"], "properties": {
        "items": {"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 20}}}},
    {"type": "object", "required": ["mood", "sure"], "properties": {
        "mood": {"type": "string", "enum": ["happy", "sad", "neutral"]}, "sure": {"type": "boolean"}}},
]  # fmt: skip
MARKUP = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_end|>", "<|im_start|>")


@dataclass
class Case:
    mode: str
    path: str
    body: dict[str, Any]
    check: Callable[[dict[str, Any]], str]  # the answer -> "" when it passes, else why not


def _validate(value: Any, schema: dict[str, Any]) -> str:
    import jsonschema

    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return f"invalid: {exc.message}"
    return ""


def _markup(text: str | None) -> str:
    return f"markup in content: {text!r}" if text and any(m in text for m in MARKUP) else ""


def _calls_ok(calls: list[tuple[str, Any]], allowed: set[str], content: str | None) -> str:
    if not calls:
        return f"no tool call (content {content!r})"
    schemas = {t["name"]: t["parameters"] for t in TOOLS}
    for name, args in calls:
        if name not in allowed:
            return f"called {name!r}, allowed {sorted(allowed)}"
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return f"arguments are not JSON: {args!r}"
        why = _validate(args, schemas[name])
        if why:
            return why
    return _markup(content)


def _openai_check(allowed: set[str]) -> Callable[[dict[str, Any]], str]:
    def check(r: dict[str, Any]) -> str:
        msg = r["choices"][0]["message"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
        why = _calls_ok(calls, allowed, msg.get("content"))
        return f"{why} (finish_reason {r['choices'][0]['finish_reason']})" if why else ""

    return check


def _anthropic_check(allowed: set[str]) -> Callable[[dict[str, Any]], str]:
    def check(r: dict[str, Any]) -> str:
        blocks = r.get("content") or []
        calls = [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
        text = "".join(b.get("text", "") for b in blocks if b["type"] == "text")
        why = _calls_ok(calls, allowed, text)
        return f"{why} (stop_reason {r.get('stop_reason')})" if why else ""

    return check


def _json_check(schema: dict[str, Any]) -> Callable[[dict[str, Any]], str]:
    def check(r: dict[str, Any]) -> str:
        choice = r["choices"][0]
        text = choice["message"].get("content") or ""
        try:
            value = json.loads(text)
        except ValueError:
            return f"not JSON ({choice['finish_reason']}): {text[:80]!r}"
        return _validate(value, schema)

    return check


def cases(mode: str, n: int, model: str, max_tokens: int, seed: int = 0, bounded: bool = False) -> list[Case]:
    """``n`` requests of one mode: openai-named, openai-required, anthropic-tool, anthropic-any, json-schema.
    ``bounded``: only tools and schemas whose values have a bounded length."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    tools = [t for t in TOOLS if not bounded or t["name"] in BOUNDED_TOOLS]
    schemas = [s for i, s in enumerate(SCHEMAS) if not bounded or i in BOUNDED_SCHEMAS]
    names = {t["name"] for t in tools}
    openai_tools = [{"type": "function", "function": t} for t in tools]
    anthropic_tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                       for t in tools]  # fmt: skip
    out = []
    for i in range(n):
        tool = tools[i % len(tools)]["name"]
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed + i,
                                "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}  # fmt: skip
        if mode == "openai-named":
            body |= {"tools": openai_tools, "tool_choice": {"type": "function", "function": {"name": tool}}}
            out.append(Case(mode, "/v1/chat/completions", body, _openai_check({tool})))
        elif mode == "openai-required":
            body |= {"tools": openai_tools, "tool_choice": "required"}
            out.append(Case(mode, "/v1/chat/completions", body, _openai_check(names)))
        elif mode == "anthropic-tool":
            body |= {"tools": anthropic_tools, "tool_choice": {"type": "tool", "name": tool}}
            out.append(Case(mode, "/v1/messages", body, _anthropic_check({tool})))
        elif mode == "anthropic-any":
            body |= {"tools": anthropic_tools, "tool_choice": {"type": "any"}}
            out.append(Case(mode, "/v1/messages", body, _anthropic_check(names)))
        else:
            schema = schemas[i % len(schemas)]
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
            out.append(Case(mode, "/v1/chat/completions", body, _json_check(schema)))
    return out


MODES = ("openai-named", "openai-required", "anthropic-tool", "anthropic-any", "json-schema")
