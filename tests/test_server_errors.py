"""Bad input, auth, overload and engine failure: errors in each API's own shape, and the server keeps serving."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from freetoken.server.settings import ServerConfig
from scripted_engine import ScriptedEngine
from server_harness import MODEL, Running, serve

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"


@pytest.fixture(scope="module")
def srv(tokenizer: Any) -> Iterator[Running]:
    with serve(ScriptedEngine(tokenizer, max_model_len=128)) as s:
        yield s


def _openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    return dict(err)


def _anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return str(body["error"]["message"])


def _ok(srv: Running) -> None:
    r = httpx.post(
        srv.url + CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    r = httpx.post(
        srv.url + MSGS, json={"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 200 and r.json()["content"][0]["text"]


BAD_OPENAI: list[tuple[str, Any, int]] = [
    ("invalid json", b"{not json", 400),
    ("not an object", b"[1, 2]", 400),
    ("wrong type", {"model": MODEL, "messages": "hello"}, 400),
    ("wrong role", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400),
    ("empty messages", {"model": MODEL, "messages": []}, 400),
    ("max_tokens 0", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400),
    (
        "max_tokens -1",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1},
        400,
    ),
    (
        "orphan tool result",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c9", "content": "r"}],
        },
        400,
    ),
    (
        "unknown part",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "hologram", "hologram": {"url": "data:"}}]}],
        },
        400,
    ),
    ("n=2", {"model": MODEL, "n": 2, "messages": [{"role": "user", "content": "x"}]}, 400),
    ("top_k -5", {"model": MODEL, "top_k": -5, "messages": [{"role": "user", "content": "x"}]}, 400),
    ("temperature 9", {"model": MODEL, "temperature": 9, "messages": [{"role": "user", "content": "x"}]}, 400),
]


@pytest.mark.parametrize("name,body,status", BAD_OPENAI, ids=[b[0] for b in BAD_OPENAI])
def test_openai_bad_input(srv: Running, name: str, body: Any, status: int) -> None:
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    for stream in (False, True):
        if stream and not isinstance(body, bytes) and isinstance(body, dict):
            kw = {"json": {**body, "stream": True}}
        _openai_error(httpx.post(srv.url + CHAT, headers={"content-type": "application/json"}, **kw), status)


BAD_ANTHROPIC: list[tuple[str, Any, int, str]] = [
    ("invalid json", b"{", 400, "invalid_request_error"),
    (
        "missing max_tokens",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
        400,
        "invalid_request_error",
    ),
    (
        "wrong type",
        {"model": MODEL, "max_tokens": "ten", "messages": [{"role": "user", "content": "x"}]},
        400,
        "invalid_request_error",
    ),
    ("empty messages", {"model": MODEL, "max_tokens": 5, "messages": []}, 400, "invalid_request_error"),
    (
        "max_tokens 0",
        {"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
        400,
        "invalid_request_error",
    ),
    (
        "orphan tool_result",
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "r"}]}
            ],
        },
        400,
        "invalid_request_error",
    ),
    (
        "unknown block",
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "hologram", "source": {"type": "base64", "data": ""}}],
                }
            ],
        },
        400,
        "invalid_request_error",
    ),
]


@pytest.mark.parametrize("name,body,status,kind", BAD_ANTHROPIC, ids=[b[0] for b in BAD_ANTHROPIC])
def test_anthropic_bad_input(srv: Running, name: str, body: Any, status: int, kind: str) -> None:
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    _anthropic_error(httpx.post(srv.url + MSGS, headers={"content-type": "application/json"}, **kw), status, kind)


def test_context_overflow_counts_an_agent_sized_prompt(srv: Running) -> None:
    """Below COUNT_UP_TO_CHARS a prompt past the context is tokenised for its refusal (agents show the count to
    their users); far above it the refusal gives a lower bound, untokenised, and says so."""
    from freetoken.server.generation import COUNT_UP_TO_CHARS

    def refusal(chars: int) -> str:
        text = ("hello world " * (chars // 12 + 1))[:chars]
        r = httpx.post(
            srv.url + MSGS, json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": text}]}
        )
        return _anthropic_error(r, 400, "invalid_request_error")

    n_small, n_big = 60_000, 2 * COUNT_UP_TO_CHARS
    counted = refusal(n_small)
    assert "(at least:" not in counted
    tokens = int(counted.split("prompt is too long: ")[1].split(" tokens")[0])
    assert tokens > n_small // 12  # the toy tokenizer: a few tokens a word, far above a chars-per-token bound
    assert "(at least: the prompt is too long to be worth tokenising)" in refusal(n_big)


def test_context_overflow_in_each_wording(srv: Running) -> None:
    long = "hello world " * 200
    r = httpx.post(srv.url + CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": long}]})
    err = _openai_error(r, 400)
    assert err["code"] == "context_length_exceeded" and "maximum context length is 128" in err["message"]
    r = httpx.post(
        srv.url + MSGS, json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": long}]}
    )
    msg = _anthropic_error(r, 400, "invalid_request_error")
    n = int(msg.split("prompt is too long: ")[1].split(" tokens")[0])
    assert n > 128 and msg.startswith(f"prompt is too long: {n} tokens > 127 maximum")
    r = httpx.post(srv.url + "/v1/responses", json={"model": MODEL, "input": long})
    assert _openai_error(r, 400)["code"] == "context_length_exceeded"
    # The SDKs surface them as their BadRequestError types.
    with pytest.raises(anthropic.BadRequestError):
        anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": long}]
        )


def test_max_tokens_clamped_to_context_left(srv: Running) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 10_000}
    prompt = httpx.post(srv.url + CHAT, json={**body, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    engine: ScriptedEngine = srv.engine
    saved = engine.script
    engine.script = lambda ids: "fox " * 500
    try:
        usage = httpx.post(srv.url + CHAT, json=body).json()["usage"]
    finally:
        engine.script = saved
    assert usage["prompt_tokens"] == prompt and usage["completion_tokens"] == 128 - prompt
    _ok(srv)


def test_server_keeps_serving_after_bad_input(srv: Running) -> None:
    for _name, body, _ in BAD_OPENAI:
        httpx.post(
            srv.url + CHAT,
            content=body if isinstance(body, bytes) else None,
            json=None if isinstance(body, bytes) else body,
            headers={"content-type": "application/json"},  # the bad bytes reach the parser, not the 415
        )
    _ok(srv)
    srv.engine.check_integrity()
    text = httpx.get(srv.url + "/metrics").text
    assert 'freetoken_errors_total{kind="invalid_request"}' in text


def test_api_key(tokenizer: Any) -> None:
    with serve(ScriptedEngine(tokenizer), ServerConfig(api_key="s3cret", served_model_names=(MODEL,))) as s:
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(s.url + CHAT, json=body).status_code == 401
        assert (
            _openai_error(httpx.post(s.url + CHAT, json=body, headers={"Authorization": "Bearer nope"}), 401)["type"]
            == "authentication_error"
        )
        _anthropic_error(
            httpx.post(s.url + MSGS, json=body, headers={"x-api-key": "nope"}), 401, "authentication_error"
        )
        assert httpx.post(s.url + CHAT, json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.post(s.url + MSGS, json=body, headers={"x-api-key": "s3cret"}).status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="bad", max_retries=0).models.list()
        assert anthropic.Anthropic(base_url=s.url, api_key="s3cret").messages.create(**body).content


def test_queue_full_is_429_and_529(tokenizer: Any) -> None:
    eng = ScriptedEngine(tokenizer, lambda ids: "fox " * 200, step_s=0.01, max_running=1, max_queued=0)
    with serve(eng) as s:
        started = threading.Event()

        def hold() -> None:
            with httpx.stream(
                "POST",
                s.url + CHAT,
                json={
                    "model": MODEL,
                    "stream": True,
                    "max_tokens": 100,
                    "messages": [{"role": "user", "content": "x"}],
                },
            ) as r:
                assert r.status_code == 200
                for _ in r.iter_lines():
                    started.set()

        t = threading.Thread(target=hold)
        t.start()
        assert started.wait(30)
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        _openai_error(httpx.post(s.url + CHAT, json=body), 429)
        _anthropic_error(httpx.post(s.url + MSGS, json=body), 529, "overloaded_error")
        t.join(60)
        _ok(s)
        s.engine.check_integrity()


def test_engine_dead_and_loading(tokenizer: Any) -> None:
    eng = ScriptedEngine(tokenizer)
    with serve(eng) as s:
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        eng.state = "loading"
        assert httpx.get(s.url + "/health").json() == {"status": "loading"}
        _openai_error(httpx.post(s.url + CHAT, json=body), 503)
        eng.state, eng.error = "dead", "CUDA error: boom"
        h = httpx.get(s.url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "unhealthy"
        assert "boom" in _openai_error(httpx.post(s.url + CHAT, json=body), 500)["message"]
        _anthropic_error(httpx.post(s.url + MSGS, json=body), 500, "api_error")
        eng.state = "ready"
        _ok(s)


def test_engine_error_mid_stream_in_each_shape(tokenizer: Any) -> None:
    with serve(ScriptedEngine(tokenizer, lambda ids: "fox " * 50, fail_after=3)) as s:
        body = {"model": MODEL, "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}
        assert "kernel fault" in _openai_error(httpx.post(s.url + CHAT, json=body), 500)["message"]
        _anthropic_error(httpx.post(s.url + MSGS, json=body), 500, "api_error")
        with pytest.raises(openai.APIError, match="kernel fault"):
            list(
                openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0).chat.completions.create(
                    model=MODEL, messages=body["messages"], max_tokens=40, stream=True
                )
            )
        with pytest.raises(anthropic.APIError, match="kernel fault"):
            with anthropic.Anthropic(base_url=s.url, api_key="k", max_retries=0).messages.stream(**body) as st:
                st.get_final_message()
        with httpx.stream("POST", s.url + "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}) as r:
            kinds = [ln[7:] for ln in r.iter_lines() if ln.startswith("event: ")]
        assert kinds[0] == "response.created" and kinds[-1] == "response.failed"
        s.engine.check_integrity()


def test_images_in_a_tool_result_become_a_note(srv: Running) -> None:
    """An agent resends a screenshot its tool returned on every turn: refusing it would wedge the session.
    (Media in a message's own content is a 400 naming the part: test_routes_parts.py.)"""
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [img]}]},
        ],
    }
    assert httpx.post(srv.url + MSGS, json=body).status_code == 200
    from freetoken.server.anthropic.convert import to_internal
    from freetoken.server.anthropic.protocol import MessagesRequest

    req = to_internal(MessagesRequest.model_validate(body))
    assert req.messages[2]["content"] == "[image omitted: this model reads text only]"
