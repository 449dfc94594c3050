"""Arguments written as text, one tag pair per argument (Qwen3-Coder, GLM, MiniMax): a string
argument is free text up to its closing tag, any other type JSON of its schema (the parsers convert
text by the schema's types, ``tools/schema.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from freetoken.chat.grammar.lark import Rules, Tags, json_value, lit, text_until

if TYPE_CHECKING:
    from freetoken.chat.grammar.tool import CallTool


def text_arguments(
    rules: Rules, tags: Tags, tool: CallTool, before: Callable[[str], str], closer: str, trail: str = ""
) -> str:
    """Every argument as ``before(key) VALUE closer trail``, in the schema's order; required ones must
    appear, the others may. A custom tool's one argument ``input`` follows its own grammar."""
    after = f"{lit(trail)}" if trail else ""
    raw = tool.raw_input(rules)
    if raw is not None:
        return f"{before('input')} {raw} {tags(closer)} {after}".strip()
    params = tool.parameters if isinstance(tool.parameters, dict) else {}
    props: dict[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or [])
    parts = []
    for key, schema in props.items():
        part = f"{before(key)} {_value(rules, tags, schema, closer)} {after}".strip()
        parts.append(part if key in required else f"({part})?")
    return " ".join(parts)


def _value(rules: Rules, tags: Tags, schema: Any, closer: str) -> str:
    if not isinstance(schema, dict) or _is_text(schema):
        enum = schema.get("enum") if isinstance(schema, dict) else None
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return f"({' | '.join(lit(v) for v in enum)}) {tags(closer)}"
        return text_until(rules, closer, tags)
    return f"{json_value(schema)} {tags(closer)}"


def _is_text(schema: dict[str, Any]) -> bool:
    """Written as raw text: a string, or a schema that allows a string or names no type at all."""
    t = schema.get("type")
    if t is None:
        return not any(k in schema for k in ("properties", "items", "const", "enum", "anyOf", "oneOf"))
    kinds = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()
    return "string" in kinds
