"""Whole grammars: an optional reasoning block, then what is forced (tool calls in the family's own
call syntax, or a JSON value). Each call format writes one call (``CallFormat.grammar``)."""

from __future__ import annotations

import importlib
from typing import Any, Literal

from freetoken.chat.grammar.lark import Rules, Tags, json_value, lit, regex, text_until
from freetoken.chat.grammar.tool import CallTool
from freetoken.chat.reasoning.think import CLOSE, OPEN

ReasoningMode = Literal["none", "optional", "open"]
"""none: no reasoning block; optional: the model may open one; open: the prompt opened it."""
MAX_PARALLEL_CALLS = 16
BLANK = r"\n{0,2}"  # after the reasoning block, as templates write it
JSON_OBJECT_LIMITS = {"key": 64, "string": 1024, "items": 64}  # characters of a key, of a string; entries of a list


class GrammarError(ValueError):
    """Nothing can be forced for this request in this model's format."""


def call_format(tool_parser: str) -> Any:
    from freetoken.chat.registry import TOOL_PARSERS

    fmt = getattr(importlib.import_module(TOOL_PARSERS[tool_parser]), "FORMAT", None)
    if fmt is None or fmt.grammar is None:
        raise GrammarError(f"tool calls cannot be forced in the {tool_parser!r} format")
    return fmt


def reasoning_part(rules: Rules, tags: Tags, mode: ReasoningMode, budget: int | None) -> str:
    if mode == "none":
        return ""
    block = f"{text_until(rules, CLOSE, tags, budget)} {regex(BLANK)}"  # the first closing tag ends it
    return block if mode == "open" else f"({tags(OPEN)} {block})?"


def forced_calls(
    tool_parser: str,
    tools: list[CallTool],
    tags: Tags,
    parallel: bool = True,
    reasoning: ReasoningMode = "none",
    reasoning_budget: int | None = None,
) -> str:
    """At least one call (at most one without ``parallel``) of one of ``tools``, nothing else after the
    reasoning block."""
    if not tools:
        raise GrammarError("no tool to call")
    rules = Rules()
    if tool_parser == "harmony":
        from freetoken.chat.grammar.harmony import harmony_calls

        return rules.render(harmony_calls(rules, tags, tools, reasoning_budget))
    fmt = call_format(tool_parser)
    body = _calls(rules, tags, fmt, tools, parallel)
    return rules.render(f"{reasoning_part(rules, tags, reasoning, reasoning_budget)} {body}".strip())


def tool_calls_anywhere(
    tool_parser: str,
    tools: list[CallTool],
    tags: Tags,
    parallel: bool = True,
    reasoning: ReasoningMode = "none",
    reasoning_budget: int | None = None,
) -> str:
    """``tool_choice`` auto with tools whose input has a grammar (Codex's custom tools): free text, and
    where the model opens calls, calls that follow the tools' schemas and grammars. Only where the call
    opener is a token of its own (free text never spells it, so text and calls cannot be confused)."""
    fmt = call_format(tool_parser)
    opener = fmt.section_open or fmt.opener
    if not tags.is_special(opener):
        raise GrammarError(f"{opener!r} is not one token: calls cannot be told from text")
    rules = Rules()
    text = rules.add(regex(r"(.|\n)*"), hint="text")
    calls = _calls(rules, tags, fmt, tools, parallel)
    head = reasoning_part(rules, tags, reasoning, reasoning_budget)
    return rules.render(f"{head} {text} ({calls} {text})?".strip())


def _calls(rules: Rules, tags: Tags, fmt: Any, tools: list[CallTool], parallel: bool) -> str:
    """One call of one of ``tools`` (up to ``MAX_PARALLEL_CALLS`` with ``parallel``), in the format's section."""
    one = rules.add(" | ".join(f"({fmt.grammar(rules, tags, t)})" for t in tools), hint="call")
    body = one
    if parallel:
        sep = f"{lit(fmt.separator)} " if fmt.separator else ""
        body = f"{one} ({sep}{one}){{0,{MAX_PARALLEL_CALLS - 1}}}"
    if fmt.section_open:
        pad = f" {lit(fmt.section_separator)} " if fmt.section_separator else " "
        body = f"{tags(fmt.section_open)}{pad}{body}{pad}{tags(fmt.section_close or '')}"
    return body


_CHAR = r'([^"\\\x00-\x1f]|\\(["\\\/bfnrt]|u[0-9a-fA-F]{4}))'  # a JSON string's character
JSON_OBJECT = rf"""start: object
object: "{{" (pair (", " pair){{0,{JSON_OBJECT_LIMITS["items"] - 1}}})? "}}"
pair: KEY ": " value
value: object | array | STRING | NUMBER | "true" | "false" | "null"
array: "[" (value (", " value){{0,{JSON_OBJECT_LIMITS["items"] - 1}}})? "]"
KEY: /"{_CHAR}{{0,{JSON_OBJECT_LIMITS["key"]}}}"/
STRING: /"{_CHAR}{{0,{JSON_OBJECT_LIMITS["string"]}}}"/
NUMBER: /-?(0|[1-9][0-9]{{0,15}})(\.[0-9]{{1,16}})?([eE][+-]?[0-9]{{1,3}})?/
"""
"""``json_object``: any JSON object, written as the templates write JSON, with every string, key, number and
list bounded (``JSON_OBJECT_LIMITS``): a model cannot write one value forever (with no bound, 8 in 10 answers of a
small model ran out of tokens inside a key)."""


def json_answer(
    schema: dict[str, Any] | None, tags: Tags, reasoning: ReasoningMode = "none", reasoning_budget: int | None = None
) -> str:
    """The answer is one JSON value of ``schema`` (None: any JSON object, ``JSON_OBJECT``) after the reasoning
    block."""
    rules = Rules()
    value = json_value(schema) if schema is not None else rules.grammar(JSON_OBJECT)
    return rules.render(f"{reasoning_part(rules, tags, reasoning, reasoning_budget)} {value}".strip())
