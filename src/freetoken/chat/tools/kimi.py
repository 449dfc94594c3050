"""Kimi-K2 calls (the tags are single tokens):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{"k": "v"}
    <|tool_call_end|>…<|tool_calls_section_end|>

The `functions.NAME:IDX` call id gives the name; our own ids replace it.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from freetoken.chat.grammar.lark import json_value, lit
from freetoken.chat.tools.base import Call, CallFormat
from freetoken.chat.tools.schema import Schemas, dump_args

if TYPE_CHECKING:
    from freetoken.chat.grammar.lark import Rules, Tags
    from freetoken.chat.grammar.tool import CallTool

ARGS = "<|tool_call_argument_begin|>"
_ID = re.compile(r"\s*(?:functions\.)?([^\s:<>]+)(?::\d+)?\s*")


def parse_body(body: str, schemas: Schemas) -> list[Call] | None:
    head, sep, tail = body.partition(ARGS)
    m = _ID.fullmatch(head)
    if not sep or m is None:
        return None
    try:
        args = json.loads(tail)
    except ValueError:
        return None
    return [(m.group(1), dump_args(args))] if isinstance(args, dict) else None


def call_grammar(rules: Rules, tags: Tags, tool: CallTool) -> str:
    call_id = f"{lit('functions.' + tool.name + ':')} /[0-9]{{1,3}}/"
    args = json_value(tool.arguments_schema())
    return f"{tags('<|tool_call_begin|>')} {call_id} {tags(ARGS)} {args} {tags('<|tool_call_end|>')}"


FORMAT = CallFormat(
    name="kimi_k2",
    opener="<|tool_call_begin|>",
    closer="<|tool_call_end|>",
    parse_body=parse_body,
    section_open="<|tool_calls_section_begin|>",
    section_close="<|tool_calls_section_end|>",
    grammar=call_grammar,
    separator="",
)
