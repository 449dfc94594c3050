"""tests/schema_strategies.py draws only valid values: every route's schema, and the keywords it covers."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from freetoken.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from freetoken.server.openai.protocol import ChatCompletionRequest, ResponsesRequest
from schema_strategies import from_schema

BOUNDS: dict[str, Any] = {
    "$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"},
                                                                 "maxItems": 2}}, "additionalProperties": False}},
    "type": "object",
    "required": ["n", "x", "s", "tag", "node"],
    "additionalProperties": {"type": "integer"},
    "properties": {
        "n": {"type": "integer", "minimum": -3, "exclusiveMaximum": 7},
        "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 1.5},
        "s": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[ab]+$"},
        "tag": {"anyOf": [{"const": "k"}, {"enum": [1, None]}]},
        "node": {"$ref": "#/$defs/Node"},
        "maybe": {"type": ["string", "null"]},
        "pair": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}]},
    },
}


@pytest.mark.parametrize("model", [ChatCompletionRequest, ResponsesRequest, MessagesRequest, CountTokensRequest])
def test_route_schemas_draw_valid_bodies(model: type[BaseModel]) -> None:
    schema = model.model_json_schema()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=from_schema(schema))
    def run(body: Any) -> None:
        jsonschema.validate(body, schema)

    run()


def test_keywords_are_honoured() -> None:
    seen: set[Any] = set()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(value=from_schema(BOUNDS))
    def run(value: Any) -> None:
        jsonschema.validate(value, BOUNDS)
        seen.add(value["tag"])

    run()
    assert seen == {"k", 1, None}


def test_an_unknown_keyword_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="if"):
        from_schema({"type": "object", "if": {}})
    assert isinstance(from_schema({"type": "null"}), st.SearchStrategy)
