"""Hermes / Qwen JSON calls: `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`.

Several blocks in a row are parallel calls. Also accepts a JSON list of such objects in one
block, `parameters` instead of `arguments`, and arguments given as a JSON-encoded string.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from freetoken.chat.grammar.lark import json_value
from freetoken.chat.tools.base import Call, CallFormat

if TYPE_CHECKING:
    from freetoken.chat.grammar.lark import Rules, Tags
    from freetoken.chat.grammar.tool import CallTool
from freetoken.chat.tools.schema import Schemas, dump_args


def _one(obj: Any) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], dump_args(args)


def parse_json_calls(body: str, schemas: Schemas | None = None) -> list[Call] | None:
    """Calls in a JSON body, or None when it is not valid call JSON."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [_one(x) for x in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def call_object(tool: CallTool) -> dict[str, Any]:
    """The schema of one call's JSON: the name, then the arguments (in the templates' order)."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": tool.arguments_schema()},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def call_grammar(rules: Rules, tags: Tags, tool: CallTool) -> str:
    return f'{tags("<tool_call>")} "\\n" {json_value(call_object(tool))} "\\n" {tags("</tool_call>")}'


FORMAT = CallFormat(
    name="hermes", opener="<tool_call>", closer="</tool_call>", parse_body=parse_json_calls, grammar=call_grammar
)
