"""Request bodies are typed as OpenAI and Anthropic validate them, every integer is bounded before it reaches a
kernel, grammars a request carries compile, and count_tokens has generation's limits (defects 5, 6 and 8 of
2026-12-05). Real HTTP server, real engine (tiny random model, CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from freetoken.server.settings import ServerConfig
from server_harness import MODEL, Running, real_engine, serve, tiny_checkpoint

CHAT, RESP, MSGS, COUNT = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
HI = [{"role": "user", "content": "hi"}]
GOOD: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL, "max_tokens": 2, "messages": HI},
    RESP: {"model": MODEL, "max_output_tokens": 2, "input": "hi"},
    MSGS: {"model": MODEL, "max_tokens": 2, "messages": HI},
}
CONTEXT = 256


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    model = tiny_checkpoint(str(tmp_path_factory.mktemp("types")))
    with serve(real_engine(model, max_model_len=CONTEXT), ServerConfig(served_model_names=(MODEL,))) as s:
        yield s


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as c:
        yield c


def _error(r: httpx.Response, path: str, status: int = 400) -> tuple[str, str | None]:
    """(message, param) after checking the status and the route's error shape."""
    assert r.status_code == status, r.text
    body = r.json()
    if path.startswith(MSGS):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        return str(body["error"]["message"]), None
    assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    return str(body["error"]["message"]), body["error"]["param"]


BIG = [2**31, 2**63, 2**64, 2**70, -(2**63) - 1]
INTS: list[tuple[str, str]] = [
    (CHAT, "top_k"), (CHAT, "n"), (CHAT, "max_tokens"), (CHAT, "max_completion_tokens"), (CHAT, "top_logprobs"),
    (CHAT, "seed"), (RESP, "max_output_tokens"), (RESP, "seed"), (MSGS, "top_k"), (MSGS, "max_tokens"),
]  # fmt: skip


@pytest.mark.parametrize("path,field", INTS, ids=[f"{p} {f}" for p, f in INTS])
def test_integers_past_their_range_are_400_naming_the_field(srv: Running, client: httpx.Client, path: str,
                                                            field: str) -> None:  # fmt: skip
    for value in BIG:
        if field == "seed" and -(2**63) <= value < 2**64:
            continue  # 64-bit seeds are seeds
        body = {**GOOD[path], field: value, **({"logprobs": True} if field == "top_logprobs" else {})}
        message, param = _error(client.post(srv.url + path, json=body), path)
        assert field in message and (param is None or param == field), message
    assert client.post(srv.url + path, json=GOOD[path]).status_code == 200


def test_top_k_past_int64_is_400_on_both_apis_then_serves(srv: Running, client: httpx.Client) -> None:
    """Before: 500 "Overflow when unpacking long long" (the soak's seed 3 found it)."""
    for path in (CHAT, MSGS):
        for stream in (False, True):
            _error(client.post(srv.url + path, json={**GOOD[path], "top_k": 2**63, "stream": stream}), path)
        r = client.post(srv.url + path, json={**GOOD[path], "top_k": 2**31 - 1})  # past the vocabulary: no cut
        assert r.status_code == 200, r.text


COERCED: list[tuple[str, str, Any]] = [
    (CHAT, "stream", "yes"), (RESP, "stream", "yes"), (MSGS, "stream", "yes"), (MSGS, "stream", 1),
    (CHAT, "max_tokens", True), (MSGS, "max_tokens", True), (CHAT, "max_tokens", "3"), (MSGS, "max_tokens", "3"),
    (RESP, "max_output_tokens", "3"), (CHAT, "max_tokens", 3.0), (MSGS, "top_k", 5.0), (CHAT, "seed", "7"),
    (CHAT, "temperature", "0.5"), (MSGS, "temperature", True), (CHAT, "logprobs", "true"), (CHAT, "n", True),
    (CHAT, "ignore_eos", 0), (CHAT, "parallel_tool_calls", "false"), (RESP, "store", "no"), (CHAT, "model", 5),
]  # fmt: skip


@pytest.mark.parametrize("path,field,value", COERCED, ids=[f"{p} {f}={v!r}" for p, f, v in COERCED])
def test_values_of_the_wrong_type_are_refused_not_coerced(srv: Running, client: httpx.Client, path: str, field: str,
                                                         value: Any) -> None:  # fmt: skip
    message, param = _error(client.post(srv.url + path, json={**GOOD[path], field: value}), path)
    assert field in message and (param is None or param == field), message


def test_numbers_still_take_integers(srv: Running, client: httpx.Client) -> None:
    for path in (CHAT, RESP, MSGS):
        r = client.post(srv.url + path, json={**GOOD[path], "temperature": 0, "top_p": 1})
        assert r.status_code == 200, r.text


def _custom_tool(definition: str, syntax: str = "lark") -> dict[str, Any]:
    fmt = {"type": "grammar", "syntax": syntax, "definition": definition}
    return {"type": "custom", "name": "apply_patch", "description": "edit files", "format": fmt}


@pytest.mark.parametrize("syntax,definition", [("lark", "start: undefined_rule"), ("lark", "..."), ("regex", "(")])
def test_an_invalid_custom_tool_grammar_is_400(srv: Running, client: httpx.Client, syntax: str,
                                               definition: str) -> None:  # fmt: skip
    """Before: 200 (the grammar was only compiled when tool_choice forced a call)."""
    for choice in ("auto", "none", "required"):
        body = {**GOOD[RESP], "tools": [_custom_tool(definition, syntax)], "tool_choice": choice}
        message, param = _error(client.post(srv.url + RESP, json=body), RESP)
        assert "apply_patch" in message and "grammar" in message and param == "tools.0.format", message


def test_a_valid_custom_tool_grammar_is_served(srv: Running, client: httpx.Client) -> None:
    for tool in (_custom_tool('start: "*** Begin Patch" /(.|\\n)*/'), _custom_tool("[a-z]+", "regex")):
        r = client.post(srv.url + RESP, json={**GOOD[RESP], "tools": [tool]})
        assert r.status_code == 200, r.text


def test_count_tokens_has_the_context_limit_of_generation(srv: Running, client: httpx.Client) -> None:
    """Before: count_tokens tokenised any prompt the body limit let through (15 MiB: 16.4 s, RSS +1 GB)."""
    fits = client.post(srv.url + COUNT, json={"model": MODEL, "messages": HI})
    assert fits.status_code == 200 and 0 < fits.json()["input_tokens"] < 20
    for size, counted in ((16 * CONTEXT, True), (600_000, False)):  # just past the context; far past it
        messages = [{"role": "user", "content": "the quick brown fox " * (size // 20)}]
        count = client.post(srv.url + COUNT, json={"model": MODEL, "messages": messages})
        chat = client.post(srv.url + MSGS, json={"model": MODEL, "max_tokens": 2, "messages": messages})
        message, _ = _error(count, COUNT)
        assert message == _error(chat, MSGS)[0]  # the same refusal, in the same words
        assert message.startswith("prompt is too long") and ("(at least" not in message) == counted, message
    assert client.post(srv.url + COUNT, json={"model": MODEL, "messages": HI}).json() == fits.json()
