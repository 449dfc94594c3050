"""Qwen3-Coder / Qwen3.5 XML calls:

    <tool_call>
    <function=NAME>
    <parameter=P>
    value
    </parameter>
    </function>
    </tool_call>

Values are text; the request's JSON schema gives their types (`convert_value`). A missing
`</parameter>` (the next `<parameter=` or `</function>` ends the value) is tolerated, and a
Hermes JSON body inside `<tool_call>` is accepted too.
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

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def parse_xml_calls(body: str, schemas: Schemas) -> list[Call] | None:
    calls: list[Call] = []
    for fm in _FUNCTION.finditer(body):
        name = fm.group(1).strip()
        if not name:
            return None
        props = schemas.get(name, {})
        args = {
            pm.group(1).strip(): convert_value(
                strip_one_newline(pm.group(2)), props.get(pm.group(1).strip()), json_fallback=False
            )
            for pm in _PARAM.finditer(fm.group(2))
        }
        calls.append((name, dump_args(args)))
    return calls or None


def parse_body(body: str, schemas: Schemas) -> list[Call] | None:
    if "<function=" in body:
        return parse_xml_calls(body, schemas)
    return parse_json_calls(body.strip(), schemas)


def call_grammar(rules: Rules, tags: Tags, tool: CallTool) -> str:
    args = text_arguments(rules, tags, tool, lambda k: lit(f"<parameter={k}>\n"), "\n</parameter>", "\n")
    head = lit(f"\n<function={tool.name}>\n")
    tail = lit("</function>\n")
    return f"{tags('<tool_call>')} {head} {args} {tail} {tags('</tool_call>')}"


FORMAT = CallFormat(
    name="qwen3_coder", opener="<tool_call>", closer="</tool_call>", parse_body=parse_body, grammar=call_grammar
)
