"""Request tool schemas, and converting text parameter values to the JSON types they declare.

XML-style call formats (Qwen3-Coder, GLM, MiniMax) write every argument as text; the request's
JSON schema says whether `5` means the number or the string.
"""

from __future__ import annotations

import json
from typing import Any

# tool name -> {parameter name -> JSON schema of that parameter}
Schemas = dict[str, dict[str, Any]]


def tool_schemas(tools: list[dict[str, Any]] | None) -> Schemas:
    """Accepts OpenAI (`{"type": "function", "function": {...}}`), flat, and Anthropic
    (`input_schema`) tool definitions."""
    out: Schemas = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") or fn.get("input_schema") or {}
        props = params.get("properties") if isinstance(params, dict) else None
        out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    found: set[str] = {t} if isinstance(t, str) else set()
    if isinstance(t, list):
        found = {x for x in t if isinstance(x, str)}
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            found |= _types(sub)
    if not found and "enum" in schema:
        found = {type_name(v) for v in schema["enum"]}
    return found


def type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    return "string"


def _try(text: str, kind: str) -> tuple[bool, Any]:
    s = text.strip()
    if kind == "null" and s.lower() in ("null", "none"):
        return True, None
    if kind == "boolean" and s.lower() in ("true", "false"):
        return True, s.lower() == "true"
    if kind in ("integer", "number"):
        try:
            return True, int(s)
        except ValueError:
            pass
    if kind == "number":
        try:
            f = float(s)
            return (f == f and f not in (float("inf"), float("-inf"))), f
        except ValueError:
            return False, None
    if kind in ("object", "array"):
        try:
            v = json.loads(s)
        except ValueError:
            return False, None
        return type_name(v) == kind, v
    return False, None


def convert_value(text: str, schema: Any, json_fallback: bool) -> Any:
    """Typed value of a text argument. Declared non-string types are tried first; a string type
    keeps the text; with no usable schema, `json_fallback` decides between JSON and raw text."""
    types = _types(schema)
    for kind in ("null", "boolean", "integer", "number", "object", "array"):
        if kind in types:
            ok, v = _try(text, kind)
            if ok:
                return v
    if "string" in types or types or not json_fallback:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def dump_args(args: dict[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)


def strip_one_newline(text: str) -> str:
    """Templates write `>\\nVALUE\\n<`; only that one newline on each side is formatting."""
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    return text
