"""GLM-4.5 / 4.6 / 4.7 calls:

    <tool_call>NAME
    <arg_key>k</arg_key>
    <arg_value>v</arg_value>
    </tool_call>

The template writes string values raw and other values as JSON, so a value is kept as text when
the schema says string and read as JSON otherwise (raw text when it is not JSON).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from freetoken.chat.grammar.lark import lit
from freetoken.chat.grammar.params import text_arguments
from freetoken.chat.tools.base import Call, CallFormat
from freetoken.chat.tools.hermes import parse_json_calls
from freetoken.chat.tools.schema import Schemas, convert_value, dump_args, strip_one_newline

if TYPE_CHECKING:
    from freetoken.chat.grammar.lark import Rules, Tags
    from freetoken.chat.grammar.tool import CallTool

_NAME = re.compile(r"\s*([^\s<>]+)\s*")
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_body(body: str, schemas: Schemas) -> list[Call] | None:
    head, sep, _ = body.partition("<arg_key>")
    m = _NAME.fullmatch(head)
    if m is None:
        return parse_json_calls(body.strip(), schemas) if not sep else None
    name = m.group(1)
    props = schemas.get(name, {})
    args = {}
    for km in _PAIR.finditer(body):
        key = km.group(1).strip()
        args[key] = convert_value(strip_one_newline(km.group(2)), props.get(key), json_fallback=True)
    if sep and not args:
        return None  # keys opened but none closed properly
    return [(name, dump_args(args))]


def call_grammar(rules: Rules, tags: Tags, tool: CallTool) -> str:
    def before(key: str) -> str:
        return f'{tags("<arg_key>")} {lit(key)} {tags("</arg_key>")} "\\n" {tags("<arg_value>")}'

    args = text_arguments(rules, tags, tool, before, "</arg_value>", "\n")
    return f"{tags('<tool_call>')} {lit(tool.name + chr(10))} {args} {tags('</tool_call>')}"


FORMAT = CallFormat(
    name="glm45", opener="<tool_call>", closer="</tool_call>", parse_body=parse_body, grammar=call_grammar
)
