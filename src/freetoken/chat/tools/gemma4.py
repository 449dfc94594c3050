"""Gemma-4 calls (the tags are single tokens):

    <|tool_call>call:NAME{key:<|"|>text<|"|>,n:3,flag:true,xs:[1,2],o:{k:<|"|>v<|"|>}}<tool_call|>

Keys are bare (or quoted); strings sit between ``<|"|>`` quote tokens, raw (no escapes); numbers, ``true``,
``false``, ``null`` are bare; objects and arrays nest with the same syntax. JSON-quoted strings are read too, so a
forced call (``call_grammar``) writes its arguments as a JSON object of the tool's schema: a form this parser reads,
not the one the model was taught.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from freetoken.chat.grammar.lark import json_value, lit
from freetoken.chat.tools.base import Call, CallFormat
from freetoken.chat.tools.schema import Schemas, dump_args

if TYPE_CHECKING:
    from freetoken.chat.grammar.lark import Rules, Tags
    from freetoken.chat.grammar.tool import CallTool

QUOTE = '<|"|>'
_HEAD = re.compile(r"\s*call:([^\s{}<>]+)\s*")
_BARE = re.compile(r"[^,:{}\[\]\s]+")
_KEY = re.compile(r"\s*([^,:{}\[\]\s\"]+|\"(?:[^\"\\]|\\.)*\")\s*:")


class _Bad(ValueError):
    pass


def _value(s: str, i: int) -> tuple[Any, int]:
    """The value starting at ``s[i]`` (after spaces) -> (value, index after it)."""
    while i < len(s) and s[i].isspace():
        i += 1
    if s.startswith(QUOTE, i):
        end = s.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise _Bad("unclosed string")
        return s[i + len(QUOTE) : end], end + len(QUOTE)
    if i < len(s) and s[i] == '"':
        v, end = json.JSONDecoder().raw_decode(s, i)
        return v, end
    if i < len(s) and s[i] in "{[":
        return _container(s, i)
    m = _BARE.match(s, i)
    if m is None:
        raise _Bad(f"no value at {i}")
    word = m.group(0)
    try:
        return json.loads(word), m.end()  # numbers, true, false, null
    except ValueError:
        return word, m.end()  # a bare word: its text


def _container(s: str, i: int) -> tuple[Any, int]:
    """``{k:v,...}`` or ``[v,...]`` at ``s[i]``."""
    obj = s[i] == "{"
    close = "}" if obj else "]"
    out: Any = {} if obj else []
    i += 1
    while True:
        while i < len(s) and s[i].isspace():
            i += 1
        if i < len(s) and s[i] == close:
            return out, i + 1
        if obj:
            m = _KEY.match(s, i)
            if m is None:
                raise _Bad(f"no key at {i}")
            key = m.group(1)
            key = json.loads(key) if key.startswith('"') else key
            out[key], i = _value(s, m.end())
        else:
            v, i = _value(s, i)
            out.append(v)
        while i < len(s) and s[i].isspace():
            i += 1
        if i < len(s) and s[i] == ",":
            i += 1
        elif i >= len(s) or s[i] != close:
            raise _Bad(f"expected , or {close} at {i}")


def parse_arguments(body: str) -> dict[str, Any] | None:
    """``{...}`` in Gemma-4's syntax -> a dict; None when malformed or followed by more than spaces."""
    try:
        args, end = _container(body, body.index("{"))
    except (_Bad, ValueError, IndexError):
        return None
    return args if isinstance(args, dict) and not body[end:].strip() else None


def parse_body(body: str, schemas: Schemas) -> list[Call] | None:
    head, brace, rest = body.partition("{")
    m = _HEAD.fullmatch(head)
    if m is None or not brace:
        return None
    args = parse_arguments(brace + rest)
    return None if args is None else [(m.group(1), dump_args(args))]


def call_grammar(rules: Rules, tags: Tags, tool: CallTool) -> str:
    args = json_value(tool.arguments_schema())
    return f"{tags('<|tool_call>')} {lit('call:' + tool.name)} {args} {tags('<tool_call|>')}"


FORMAT = CallFormat(name="gemma4", opener="<|tool_call>", closer="<tool_call|>", parse_body=parse_body,
                    grammar=call_grammar, separator="")  # fmt: skip
