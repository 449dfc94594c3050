"""MiniMax-M2 calls (several `<invoke>` in one block are parallel calls):

<minimax:tool_call>
<invoke name="NAME">
<parameter name="k">v</parameter>
</invoke>
</minimax:tool_call>
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from freetoken.chat.grammar.lark import lit
from freetoken.chat.grammar.params import text_arguments
from freetoken.chat.tools.base import Call, CallFormat
from freetoken.chat.tools.schema import Schemas, convert_value, dump_args, strip_one_newline

if TYPE_CHECKING:
    from freetoken.chat.grammar.lark import Rules, Tags
    from freetoken.chat.grammar.tool import CallTool

# The body starts right after `<invoke`.
_HEAD = re.compile(r"\s+name=(?:\"([^\"]+)\"|'([^']+)'|([^\s>]+))\s*>")
_PARAM = re.compile(r"<parameter\s+name=(?:\"([^\"]+)\"|'([^']+)'|([^\s>]+))\s*>(.*?)</parameter>", re.DOTALL)


def parse_body(body: str, schemas: Schemas) -> list[Call] | None:
    m = _HEAD.match(body)
    if m is None:
        return None
    name = next(g for g in m.groups() if g)
    props = schemas.get(name, {})
    args = {}
    for pm in _PARAM.finditer(body, m.end()):
        key = next(g for g in pm.groups()[:3] if g)
        args[key] = convert_value(strip_one_newline(pm.group(4)), props.get(key), json_fallback=True)
    return [(name, dump_args(args))]


def call_grammar(rules: Rules, tags: Tags, tool: CallTool) -> str:
    args = text_arguments(rules, tags, tool, lambda k: lit(f'<parameter name="{k}">'), "</parameter>", "\n")
    return f"{tags('<invoke')} {lit(f' name={chr(34)}{tool.name}{chr(34)}>' + chr(10))} {args} {tags('</invoke>')}"


FORMAT = CallFormat(
    name="minimax_m2",
    opener="<invoke",
    closer="</invoke>",
    parse_body=parse_body,
    section_open="<minimax:tool_call>",
    section_close="</minimax:tool_call>",
    bare_calls=False,
    grammar=call_grammar,
    section_separator="\n",
)
