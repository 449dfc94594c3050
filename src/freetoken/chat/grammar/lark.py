"""Pieces of Lark (llguidance's dialect) shared by the call formats: literals, special tokens,
embedded JSON schemas, free text up to a closing tag."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

# How embedded JSON is written: the separators templates use (``tojson``/``json.dumps``), no free
# whitespace (a model cannot pad forever), keywords the engine cannot enforce ignored, not refused.
JSON_STYLE: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,
}


def lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def regex(pattern: str) -> str:
    """A Lark regex terminal (``/`` escaped)."""
    return "/" + pattern.replace("/", "\\/") + "/"


class Tags:
    """Writes a format's tags: as a token (``<name>``) when the tokenizer has the tag as one added token,
    special or not (llguidance reads every added token as one, and free text never spells it), else
    as a literal."""

    def __init__(self, special_tokens: Iterable[str] = ()) -> None:
        self.special = frozenset(special_tokens)

    @classmethod
    def of(cls, tokenizer: Any) -> Tags:
        decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
        return cls(t.content for t in decoder.values())

    def __call__(self, tag: str) -> str:
        if tag in self.special and tag.startswith("<") and tag.endswith(">") and ">" not in tag[1:-1]:
            return tag
        return lit(tag)

    def is_special(self, tag: str) -> bool:
        return tag in self.special


def json_value(schema: dict[str, Any] | bool) -> str:
    """``%json {…}``: a value of ``schema`` written as the templates write JSON. Objects that list
    their properties and say nothing of others get no others (OpenAI's strict mode), and integers with
    no bound stay within JSON's safe integers (±(2**53 - 1)): the value still validates against
    ``schema``, and a model cannot add keys or digits forever."""
    body: dict[str, Any] = closed(schema) if isinstance(schema, dict) else {}
    style = dict(JSON_STYLE)
    style.update(body.get("x-guidance") or {})
    body["x-guidance"] = style
    return "%json " + json.dumps(body, ensure_ascii=False)


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


SAFE_INTEGER = 2**53 - 1


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists properties and says
    nothing of other keys, and safe-integer bounds on integers that have none (a copy)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(v) for v in out[key]]
    for key in ("items", "additionalProperties", "not", "if", "then", "else"):
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    if isinstance(out.get("properties"), dict) and not {"additionalProperties", "patternProperties"} & set(out):
        out["additionalProperties"] = False
    kinds = out.get("type")
    if kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds and "number" not in kinds):
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -SAFE_INTEGER
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = SAFE_INTEGER
    return out


class Rules:
    """The named rules of one grammar, gathered while the parts are written."""

    def __init__(self) -> None:
        self._rules: list[str] = []
        self._side: list[dict[str, str]] = []  # whole Lark grammars referenced as @name
        self._n = 0

    def add(self, body: str, attrs: str = "", hint: str = "r") -> str:
        """A new rule ``hint_N[attrs]: body``; returns its name."""
        self._n += 1
        name = f"{hint}_{self._n}"
        self._rules.append(f"{name}{'[' + attrs + ']' if attrs else ''}: {body}")
        return name

    def grammar(self, lark: str) -> str:
        """A whole Lark grammar (its own ``start``) used as one part; returns the reference ``@name``."""
        self._n += 1
        name = f"g_{self._n}"
        self._side.append({"name": name, "lark_grammar": lark})
        return "@" + name

    def render(self, start: str) -> str:
        """Lark text, or llguidance's JSON list of grammars when whole grammars were referenced."""
        main = "\n".join([f"start: {start}", *self._rules]) + "\n"
        if not self._side:
            return main
        return json.dumps({"grammars": [{"name": "main", "lark_grammar": main}, *self._side]}, ensure_ascii=False)


ANY_TEXT = r"(.|\n)*"


def text_until(rules: Rules, closer: str, tags: Tags, budget: int | None = None) -> str:
    """Free text ended by ``closer`` (its first occurrence closes); ``budget``: at most so many tokens."""
    limit = f"max_tokens={budget}" if budget else ""
    if tags.is_special(closer):  # free text cannot produce a special token: the token alone ends it
        return f"{rules.add(regex(ANY_TEXT), limit, 'text')} {tags(closer)}"
    return rules.add(regex(ANY_TEXT + _escape(closer)), ", ".join(x for x in ("lazy", limit) if x), "text")


def _escape(text: str) -> str:
    """``text`` matched literally inside a regex (``regex()`` escapes the slashes)."""
    out = []
    for c in text:
        if c == "\n":
            out.append("\\n")
        elif c in r"\.+*?()|[]{}^$-#&~\"":
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)
