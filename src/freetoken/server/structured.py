"""Structured output for one request: the grammar the engine enforces, or None.

- ``tool_choice`` required / named (Anthropic any / tool): at least one call of the allowed tools
  (exactly one for a named tool or when parallel calls are off), in the family's own call syntax, so its parser
  turns the text into API tool calls; arguments follow each tool's JSON schema; a custom tool's
  input follows its Lark or regex grammar where the format writes arguments as raw text (inside
  a JSON string, only a regex can be enforced).
- ``tool_choice`` auto with a custom tool that carries a grammar (Codex): text, and any call the model
  opens follows the tools' schemas and grammars (where the call opener is a token of its own).
- ``response_format`` json_schema / json_object: the answer is one JSON value of the schema (any JSON object for
  json_object); the grammar ends it, so an answer that finishes with ``stop`` parses (one cut by ``max_tokens``
  finishes with ``length``).
Either may follow the family's reasoning block (bounded to half the output budget).
"""

from __future__ import annotations

from typing import Any

from freetoken.chat.grammar import (
    CallTool,
    GrammarError,
    ReasoningMode,
    Tags,
    forced_calls,
    json_answer,
    tool_calls_anywhere,
)
from freetoken.chat.registry import resolve_family
from freetoken.engine.errors import InputError
from freetoken.engine.grammar import check_grammar
from freetoken.server.errors import APIError
from freetoken.server.internal import ChatRequest, ToolSpec


def parsers(family: str | None, tool_parser: str | None, reasoning_parser: str | None) -> tuple[str | None, str | None]:
    """The tool and reasoning parsers in effect ("none" turns one off)."""
    fam = resolve_family(family) if family else None
    tp = tool_parser if tool_parser is not None else (fam.tool_parser if fam else None)
    rp = reasoning_parser if reasoning_parser is not None else (fam.reasoning_parser if fam else None)
    return (None if tp == "none" else tp), (None if rp == "none" else rp)


def reasoning_mode(req: ChatRequest, reasoning_parser: str | None, starts_in_reasoning: bool) -> ReasoningMode:
    if reasoning_parser != "think":
        return "none"
    if starts_in_reasoning:
        return "open"
    return "none" if req.reasoning is False else "optional"


def call_tool(t: ToolSpec) -> CallTool:
    return CallTool(t.name, t.parameters, t.grammar_syntax, t.grammar_definition)


def check_tool_grammars(tools: list[ToolSpec]) -> None:
    """Every custom tool's input grammar compiles (a 400 naming the tool otherwise), whether or not this
    request's grammar will enforce it: a client should learn of a broken grammar on its first request."""
    for i, t in enumerate(tools):
        if t.grammar_syntax:
            try:
                check_grammar(t.grammar_syntax, t.grammar_definition)
            except InputError as exc:
                raise APIError.invalid(f"tools[{i}] ({t.name}): {exc}", param=f"tools.{i}.format") from exc


def request_grammar(
    req: ChatRequest,
    tools: list[ToolSpec],
    tokenizer: Any,
    tool_parser: str | None,
    reasoning: ReasoningMode,
    max_tokens: int,
) -> str | None:
    """The grammar for ``req`` (``tools``: the ones it may call), or None when nothing is constrained."""
    check_tool_grammars(req.tools)
    tags = Tags.of(tokenizer)
    budget = max(16, max_tokens // 2)
    if req.tool_choice.mode in ("required", "named") and tools:
        if tool_parser is None:
            raise APIError.invalid(
                "tool_choice cannot be enforced: this model has no known tool-call format", param="tool_choice"
            )
        parallel = req.parallel_tool_calls and req.tool_choice.mode == "required"  # a named tool: one call
        try:
            return forced_calls(tool_parser, [call_tool(t) for t in tools], tags, parallel, reasoning, budget)
        except GrammarError as exc:
            raise APIError.invalid(str(exc), param="tool_choice") from exc
    if req.tool_choice.mode == "auto" and tool_parser and any(t.grammar_syntax for t in tools):
        try:
            return tool_calls_anywhere(
                tool_parser, [call_tool(t) for t in tools], tags, req.parallel_tool_calls, reasoning, budget
            )
        except GrammarError:
            pass  # calls cannot be told from text in this format: left unconstrained
    fmt = req.response_format
    if fmt is not None and fmt.type in ("json_schema", "json_object"):
        return json_answer(fmt.schema if fmt.type == "json_schema" else None, tags, reasoning, budget)
    return None
