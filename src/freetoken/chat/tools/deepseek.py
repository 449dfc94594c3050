"""DeepSeek V3 / V3.1 / R1 calls (the tags are single tokens; `｜` is U+FF5C, `▁` U+2581).

V3.1:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"k": "v"}<｜tool▁call▁end｜>…
       <｜tool▁calls▁end｜>
V3/R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
       ```json
       {"k": "v"}
       ```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
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

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

_V3 = re.compile(r"\s*([^\s`]+)\s*\n```(?:json)?\s*\n(.*?)\n?```\s*", re.DOTALL)


def _args(text: str) -> str | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return dump_args(obj) if isinstance(obj, dict) else None


def parse_body(body: str, schemas: Schemas) -> list[Call] | None:
    head, sep, tail = body.partition(SEP)
    if not sep:
        return None
    if head.strip() == "function":
        m = _V3.fullmatch(tail)
        if m is not None:
            args = _args(m.group(2))
            return [(m.group(1), args)] if args is not None else None
    name = head.strip()
    args = _args(tail)
    if not name or any(c.isspace() for c in name) or args is None:
        return None
    return [(name, args)]


def call_grammar(rules: Rules, tags: Tags, tool: CallTool) -> str:
    """The V3.1 form (NAME, separator, JSON)."""
    args = json_value(tool.arguments_schema())
    return f"{tags(CALL_BEGIN)} {lit(tool.name)} {tags(SEP)} {args} {tags(CALL_END)}"


FORMAT = CallFormat(
    name="deepseek_v3",
    opener=CALL_BEGIN,
    closer=CALL_END,
    parse_body=parse_body,
    section_open=CALLS_BEGIN,
    section_close=CALLS_END,
    grammar=call_grammar,
    separator="",
)
