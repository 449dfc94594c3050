"""Hypothesis strategies for the JSON Schemas pydantic emits, built on hypothesis' public API alone.

Replaces hypothesis-jsonschema (its last release, 0.23.1 of 2024, reaches into hypothesis internals that later
hypothesis releases removed: ``'many' object has no attribute 'more'``). Covers the keywords our routes' schemas
use — types, ``anyOf``/``oneOf``/``allOf``, ``enum``/``const``, ``$ref`` into ``$defs``, object properties, arrays,
numeric and length bounds, ``pattern`` — and refuses any other keyword, so a schema change that needs more is seen
at once rather than fuzzed loosely. Generated values are valid against the schema (``tests/test_schema_strategies.py``
checks that with jsonschema).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

_IGNORED = {"title", "description", "default", "examples", "discriminator", "format", "deprecated", "readOnly"}
_HANDLED = {
    "type", "anyOf", "oneOf", "allOf", "enum", "const", "$ref", "$defs", "properties", "required",
    "additionalProperties", "items", "prefixItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "minItems", "maxItems", "pattern", "uniqueItems",
}  # fmt: skip
_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid against ``schema`` (a pydantic ``model_json_schema()``; ``$ref`` resolves into its ``$defs``)."""
    return _Builder(schema.get("$defs", {})).build(schema)


class _Builder:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs
        self.refs: dict[str, st.SearchStrategy[Any]] = {}

    def build(self, s: dict[str, Any] | bool) -> st.SearchStrategy[Any]:
        if s is True or s == {}:
            return _ANY_JSON
        if s is False:
            return st.nothing()
        unknown = set(s) - _HANDLED - _IGNORED
        if unknown:
            raise NotImplementedError(f"schema keywords not covered by schema_strategies: {sorted(unknown)}")
        if "$ref" in s:
            return self._ref(s["$ref"])
        if "const" in s:
            return st.just(s["const"])
        if "enum" in s:
            return st.sampled_from(s["enum"])
        for key in ("anyOf", "oneOf"):
            if key in s:
                rest = {k: v for k, v in s.items() if k != key and k not in _IGNORED}
                return st.one_of([self.build({**rest, **sub}) for sub in s[key]])
        if "allOf" in s:
            if len(s["allOf"]) != 1:
                raise NotImplementedError("allOf with more than one schema")
            return self.build({**{k: v for k, v in s.items() if k != "allOf"}, **s["allOf"][0]})
        kind = s.get("type")
        if isinstance(kind, list):
            return st.one_of([self.build({**s, "type": k}) for k in kind])
        return self._typed(kind, s)

    def _ref(self, ref: str) -> st.SearchStrategy[Any]:
        prefix = "#/$defs/"
        if not ref.startswith(prefix):
            raise NotImplementedError(f"$ref outside $defs: {ref}")
        name = ref[len(prefix) :]
        if name not in self.refs:  # deferred: recursive models refer to themselves
            self.refs[name] = st.deferred(lambda: self.build(self.defs[name]))
        return self.refs[name]

    def _typed(self, kind: str | None, s: dict[str, Any]) -> st.SearchStrategy[Any]:
        if kind is None:
            return _ANY_JSON
        if kind == "null":
            return st.none()
        if kind == "boolean":
            return st.booleans()
        if kind in ("integer", "number"):
            return _number(kind, s)
        if kind == "string":
            if "pattern" in s:
                return st.from_regex(s["pattern"], fullmatch=False).filter(
                    lambda v: s.get("minLength", 0) <= len(v) <= s.get("maxLength", len(v))
                )
            return st.text(min_size=s.get("minLength", 0), max_size=min(s.get("maxLength", 24), 24))
        if kind == "array":
            return self._array(s)
        if kind == "object":
            return self._object(s)
        raise NotImplementedError(f"schema type {kind!r}")

    def _array(self, s: dict[str, Any]) -> st.SearchStrategy[Any]:
        if "prefixItems" in s:
            return st.tuples(*(self.build(p) for p in s["prefixItems"])).map(list)
        lo = s.get("minItems", 0)
        item = self.build(s.get("items", True))
        return st.lists(item, min_size=lo, max_size=max(lo, min(s.get("maxItems", 3), 3)),
                        unique_by=_json_key if s.get("uniqueItems") else None)

    def _object(self, s: dict[str, Any]) -> st.SearchStrategy[Any]:
        props: dict[str, Any] = s.get("properties", {})
        required = set(s.get("required", ()))
        fixed = st.fixed_dictionaries(
            {k: self.build(v) for k, v in props.items() if k in required},
            optional={k: self.build(v) for k, v in props.items() if k not in required},
        )
        extra = s.get("additionalProperties", True)
        if extra is False:
            return fixed
        names = st.text(max_size=6).filter(lambda k: k not in props)
        extras = st.dictionaries(names, self.build(extra), max_size=2)
        return st.tuples(fixed, extras).map(lambda t: {**t[1], **t[0]})


def _number(kind: str, s: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Integers within the bounds; for "number" also floats (JSON numbers need not be whole)."""
    lo, hi = s.get("minimum"), s.get("maximum")
    xlo, xhi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    ilo = [math.ceil(lo)] if lo is not None else []
    ilo += [math.floor(xlo) + 1] if xlo is not None else []
    ihi = [math.floor(hi)] if hi is not None else []
    ihi += [math.ceil(xhi) - 1] if xhi is not None else []
    ints = st.integers(min_value=max(ilo, default=None), max_value=min(ihi, default=None))
    if kind == "integer":
        return ints
    floats = st.floats(
        min_value=lo if lo is not None else xlo, max_value=hi if hi is not None else xhi,
        exclude_min=lo is None and xlo is not None, exclude_max=hi is None and xhi is not None,
        allow_nan=False, allow_infinity=False,
    )
    return floats | ints


def _json_key(v: Any) -> str:
    return json.dumps(v, sort_keys=True)
