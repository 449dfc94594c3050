"""A schema fuzzer over the three APIs: bodies drawn from each route's own pydantic schema (mostly
well-formed, oddly valued), the same with one field replaced by any JSON value, and any JSON at all,
posted to the real server with the real engine. No answer may be a 5xx, every error has its API's
shape, every stream ends as its API says, and the engine serves on with its caches sound."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from freetoken.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from freetoken.server.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponsesRequest,
    TokenizeRequest,
)
from freetoken.server.settings import ServerConfig
from schema_strategies import from_schema
from server_harness import MODEL, Running, real_engine, serve, tiny_checkpoint

ROUTES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
    "/v1/completions": CompletionRequest,
    "/v1/tokenize": TokenizeRequest,
    "/v1/detokenize": DetokenizeRequest,
}
_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    model = tiny_checkpoint(str(tmp_path_factory.mktemp("fuzz")))
    config = ServerConfig(served_model_names=(MODEL,), max_body_bytes=256 * 1024)
    with serve(real_engine(model, max_model_len=256), config) as s:
        yield s
        s.engine.check_integrity()


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """The route's schema, with the served model name likely and generation short (the fuzzer looks
    for crashes, not long answers; clamping huge max_tokens is tested elsewhere)."""
    schema = model.model_json_schema()
    props = schema["properties"]
    props["model"] = {"enum": [MODEL, MODEL, "some-other-model"]}
    for name in _TOKEN_FIELDS:
        if name in props:
            props[name] = {"anyOf": [{"type": "integer", "minimum": -2, "maximum": 3}, {"type": "null"}]}
    return schema


def _bodies(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    valid = from_schema(_schema(model))
    fields = list(model.model_json_schema()["properties"])
    mutated = st.tuples(valid, st.sampled_from(fields), JSON).map(lambda t: {**t[0], t[1]: t[2]})
    return st.one_of(valid, valid, mutated, JSON)


def _check(path: str, r: httpx.Response, stream: bool) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code != 200:
        body = r.json()
        if path.startswith("/v1/messages"):
            assert body["type"] == "error" and {"type", "message"} <= set(body["error"]), body
        else:
            assert {"message", "type", "param", "code"} <= set(body["error"]), body
        return
    if not stream:
        json.loads(r.text)
        return
    lines = [ln for ln in r.text.splitlines() if ln]
    if path in ("/v1/chat/completions", "/v1/completions"):
        assert lines[-1] == "data: [DONE]", lines[-3:]
    elif path == "/v1/messages":
        assert lines[-2] in ("event: message_stop", "event: error"), lines[-3:]
    else:
        assert lines[-2] in ("event: response.completed", "event: response.incomplete", "event: response.failed")


@pytest.mark.parametrize("path", list(ROUTES))
def test_fuzzed_bodies_never_get_a_5xx(srv: Running, path: str) -> None:
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=_bodies(ROUTES[path]))
    def run(body: Any) -> None:
        raw = json.dumps(body)  # ASCII escapes, so lone surrogates travel as the client sent them
        r = httpx.post(srv.url + path, content=raw, headers={"content-type": "application/json"}, timeout=120)
        _check(path, r, isinstance(body, dict) and body.get("stream") is True)

    run()
    ok = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert ok.status_code == 200
    srv.engine.check_integrity()
