"""Anthropic routes through the official ``anthropic`` SDK against a real uvicorn server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from freetoken.server.anthropic.convert import to_internal
from freetoken.server.anthropic.protocol import MessagesRequest
from scripted_engine import ScriptedEngine
from server_harness import MODEL, Running, serve

TOOLS: Any = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
SCRIPT = (
    "<think>\nNeed the weather.\n</think>\n\nLet me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)

STREAM_BODY: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 300,
    "stream": True,
    "tools": TOOLS,
    "messages": [{"role": "user", "content": "Weather?"}],
}

@pytest.fixture(scope="module")
def scripted(tokenizer: Any) -> Iterator[Running]:
    def script(ids: list[int]) -> str:
        prompt = tokenizer.decode(ids)
        return "The answer. STOP and more" if "use the stop" in prompt else SCRIPT

    with serve(ScriptedEngine(tokenizer, script)) as srv:
        yield srv


def client(srv: Running) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)


def _blocks(m: Any) -> list[Any]:
    out: list[Any] = []
    for b in m.content:
        if b.type == "thinking":
            out.append(("thinking", b.thinking, b.signature))
        elif b.type == "text":
            out.append(("text", b.text))
        else:
            out.append(("tool_use", b.name, b.input))
    return out


def test_thinking_text_tool_use_stream_equals_nonstream(scripted: Running) -> None:
    c = client(scripted)
    kw: dict[str, Any] = dict(
        model=MODEL,
        max_tokens=300,
        tools=TOOLS,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        thinking={"type": "enabled", "budget_tokens": 100},
    )
    full = c.messages.create(**kw)
    with c.messages.stream(**kw) as s:
        streamed = s.get_final_message()
    assert _blocks(full) == _blocks(streamed)
    assert [b[:2] for b in _blocks(full)] == [
        ("thinking", "Need the weather."),
        ("text", "Let me check."),
        ("tool_use", "get_weather"),
    ]
    assert _blocks(full)[2][2] == {"city": "Paris"} and _blocks(full)[0][2]
    assert full.stop_reason == streamed.stop_reason == "tool_use"
    assert full.usage.input_tokens == streamed.usage.input_tokens
    assert full.usage.output_tokens == streamed.usage.output_tokens > 0
    assert full.content[2].id.startswith("toolu_")  # type: ignore[union-attr]


def test_raw_event_sequence(scripted: Running) -> None:
    body = dict(STREAM_BODY)
    counted = client(scripted).messages.count_tokens(model=MODEL, tools=TOOLS, messages=body["messages"])
    with httpx.stream("POST", scripted.url + "/v1/messages", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    events = [(a[7:], json.loads(b[6:])) for a, b in zip(lines[::2], lines[1::2])]
    kinds = [k for k, _ in events]
    assert all(k == p["type"] for k, p in events)
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == counted.input_tokens > 0
    deltas = [p["delta"]["type"] for k, p in events if k == "content_block_delta"]
    for d in ("thinking_delta", "signature_delta", "text_delta", "input_json_delta"):
        assert d in deltas
    starts = [p["index"] for k, p in events if k == "content_block_start"]
    stops = [p["index"] for k, p in events if k == "content_block_stop"]
    assert starts == stops == [0, 1, 2]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_stop_sequence_and_max_tokens(scripted: Running) -> None:
    c = client(scripted)
    msgs: Any = [{"role": "user", "content": "please use the stop"}]
    m = c.messages.create(model=MODEL, max_tokens=100, messages=msgs, stop_sequences=["STOP"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    assert _blocks(m) == [("text", "The answer.")]
    m = c.messages.create(model=MODEL, max_tokens=2, messages=msgs)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2
    m = c.messages.create(model=MODEL, max_tokens=100, messages=msgs)
    assert m.stop_reason == "end_turn" and _blocks(m) == [("text", "The answer. STOP and more")]


def test_claude_code_shapes_accepted(scripted: Running) -> None:
    """?beta=true, unknown headers and fields, system blocks with cache_control, role=system items."""
    body = {
        "model": MODEL,
        "max_tokens": 50,
        "metadata": {"user_id": "u"},
        "some_future_field": {"x": 1},
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0; cch=ab12f;"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "ponder", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "is_error": True,
                        "content": [{"type": "text", "text": "no network"}],
                    },
                    {"type": "text", "text": "try again"},
                ],
            },
            {"role": "system", "content": "Late system note."},
        ],
        "tools": TOOLS,
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "adaptive"},
    }
    headers = {
        "anthropic-beta": "interleaved-thinking-2025-05-14,fine-grained-tool-streaming",
        "anthropic-version": "2023-06-01",
        "x-stainless-whatever": "1",
        "x-app": "cli",
    }
    r = httpx.post(scripted.url + "/v1/messages?beta=true", json=body, headers=headers)
    assert r.status_code == 200, r.text
    req = to_internal(MessagesRequest.model_validate(body))
    assert req.messages[0] == {
        "role": "system",
        "content": "x-anthropic-billing-header: cc_version=2.0; cch=00000;\nYou are Claude Code.\n\nLate system note.",
    }
    assert req.messages[2] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "ponder",
        "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}
        ],
    }
    assert req.messages[3:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no network"},
        {"role": "user", "content": "try again"},
    ]


def test_billing_header_keeps_prompt_identical(scripted: Running) -> None:
    c = client(scripted)

    def ids(cch: str) -> list[int]:
        body = MessagesRequest.model_validate(
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}],
                "system": [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.3; cch={cch};"}],
            }
        )
        return scripted.state.generation().render(to_internal(body))

    assert ids("1a2b3") == ids("ffff0")
    assert c.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}]).input_tokens > 0


def test_special_token_text_in_content_stays_text(scripted: Running) -> None:
    tok = scripted.engine.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    body = MessagesRequest.model_validate(
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "a<|im_end|>b<tool_call>"}]}
    )
    ids = scripted.state.generation().render(to_internal(body))
    plain = scripted.state.generation().render(
        to_internal(
            MessagesRequest.model_validate(
                {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "ab"}]}
            )
        )
    )
    assert ids.count(im_end) == plain.count(im_end)


def test_keepalive_pings_while_a_tool_call_is_written(tokenizer: Any) -> None:
    """A call's arguments arrive whole at its end; the silence before is filled with pings."""
    from freetoken.server.settings import ServerConfig

    eng = ScriptedEngine(tokenizer, lambda ids: SCRIPT, step_s=0.03)
    with serve(eng, ServerConfig(served_model_names=(MODEL,), keepalive_s=0.1)) as srv:
        body = dict(STREAM_BODY)
        with httpx.stream("POST", srv.url + "/v1/messages", json=body) as r:
            kinds = [ln[7:] for ln in r.iter_lines() if ln.startswith("event: ")]
        assert kinds[:2] == ["message_start", "ping"]
        assert "ping" in kinds[2 : kinds.index("message_delta")]  # silence while the call was generated
        with client(srv).messages.stream(**{k: v for k, v in body.items() if k != "stream"}) as s:
            m = s.get_final_message()
        assert m.stop_reason == "tool_use" and m.content[-1].input == {"city": "Paris"}  # type: ignore[union-attr]
        chat_tools = [
            {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in TOOLS
        ]
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "tools": chat_tools}) as r:
            lines = list(r.iter_lines())
        assert ": keep-alive" in lines and [ln for ln in lines if ln][-1] == "data: [DONE]"
        eng.check_integrity()
