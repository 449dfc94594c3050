"""Stop sequences apply to the answer: never inside the reasoning block, never cutting a tool call's markup, in
both APIs and both streaming modes (the real openai and anthropic SDKs against the real server on loopback; a
scripted engine writes the reasoning and tool calls a random tiny model never would)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from freetoken.chat import events as ev
from freetoken.server.stops import StopFilter
from scripted_engine import ScriptedEngine
from server_harness import MODEL, Running, serve

REASONED = "<think>\n23 + 19 = 42, so the sum is 42.\n</think>\n\nThe sum: 23 + 19 = 42. Done."
CALL = ('<think>\nCall it with a=b.\n</think>\n\nChecking = now.\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a=42"}}\n</tool_call>')  # fmt: skip
TOOL: Any = {"name": "get_weather", "description": "weather", "parameters": {"type": "object",
             "properties": {"city": {"type": "string"}}}}  # fmt: skip


@pytest.fixture(scope="module")
def srv(tokenizer: Any) -> Iterator[Running]:
    def script(ids: list[int]) -> str:
        return CALL if "weather" in tokenizer.decode(ids) else REASONED

    with serve(ScriptedEngine(tokenizer, script, step_s=0.0)) as s:
        yield s


def _openai(srv: Running, stop: list[str], stream: bool, tools: bool = False) -> tuple[str, str, list[Any], str]:
    """(reasoning, content, tool calls, finish reason)."""
    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
    extra: Any = {"tools": [{"type": "function", "function": TOOL}]} if tools else {}
    msgs: Any = [{"role": "user", "content": "weather?" if tools else "What is 23 + 19?"}]
    if not stream:
        r = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200, stop=stop, **extra)
        m: Any = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
        return m.reasoning_content or "", m.content or "", calls, r.choices[0].finish_reason
    reasoning, content, finish, args = "", "", "", {}  # type: ignore[var-annotated]
    names: dict[int, str] = {}
    for chunk in oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200, stop=stop, stream=True,
                                            **extra):  # fmt: skip
        d: Any = chunk.choices[0].delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.function.name:
                names[tc.index] = tc.function.name
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    return reasoning, content, [(names[i], args[i]) for i in sorted(names)], finish


@pytest.mark.parametrize("stream", [False, True])
def test_openai_stop_never_inside_the_reasoning(srv: Running, stream: bool) -> None:
    reasoning, content, calls, finish = _openai(srv, ["="], stream)
    assert reasoning.strip() == "23 + 19 = 42, so the sum is 42."
    assert (content, calls, finish) == ("The sum: 23 + 19", [], "stop")
    reasoning, content, _, finish = _openai(srv, ["42"], stream)
    assert "42, so the sum is 42." in reasoning and (content, finish) == ("The sum: 23 + 19 =", "stop")
    _, content, _, finish = _openai(srv, ["Done!", "nowhere"], stream)  # a prefix held back, then let go
    assert (content, finish) == ("The sum: 23 + 19 = 42. Done.", "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_openai_stop_never_cuts_a_tool_call(srv: Running, stream: bool) -> None:
    reasoning, content, calls, finish = _openai(srv, ["42", "a=b"], stream, tools=True)
    assert reasoning.strip() == "Call it with a=b." and content.strip() == "Checking = now."
    assert calls == [("get_weather", '{"city": "a=42"}')] and finish == "tool_calls"
    _, content, calls, finish = _openai(srv, ["="], stream, tools=True)  # in the answer before the call: it ends
    assert (content, calls, finish) == ("Checking", [], "stop")


def _anthropic(srv: Running, stop: list[str], stream: bool, tools: bool = False) -> Any:
    an = anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0)
    extra: Any = {"tools": [{"name": TOOL["name"], "input_schema": TOOL["parameters"]}]} if tools else {}
    msgs: Any = [{"role": "user", "content": "weather?" if tools else "What is 23 + 19?"}]
    if not stream:
        return an.messages.create(model=MODEL, max_tokens=200, messages=msgs, stop_sequences=stop, **extra)
    with an.messages.stream(model=MODEL, max_tokens=200, messages=msgs, stop_sequences=stop, **extra) as st:
        return st.get_final_message()


def _blocks(m: Any) -> list[tuple[str, Any]]:
    return [(b.type, b.thinking.strip() if b.type == "thinking" else b.text if b.type == "text" else b.input)
            for b in m.content]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_stop_sequences_apply_to_the_text_only(srv: Running, stream: bool) -> None:
    m = _anthropic(srv, ["42"], stream)
    assert _blocks(m) == [("thinking", "23 + 19 = 42, so the sum is 42."), ("text", "The sum: 23 + 19 =")]
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "42")
    m = _anthropic(srv, ["42", "a=b"], stream, tools=True)
    assert _blocks(m) == [("thinking", "Call it with a=b."), ("text", "Checking = now."),
                          ("tool_use", {"city": "a=42"})]  # fmt: skip
    assert (m.stop_reason, m.stop_sequence) == ("tool_use", None)
    m = _anthropic(srv, ["="], stream, tools=True)
    assert _blocks(m) == [("thinking", "Call it with a=b."), ("text", "Checking")]
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "=")


def test_the_filter_holds_back_only_what_could_still_match() -> None:
    f = StopFilter(["STOP", "xy"])
    out = f.apply([ev.ContentDelta("ab ST"), ev.ReasoningDelta("r"), ev.ContentDelta("x")])
    assert out == [ev.ContentDelta("ab"), ev.ContentDelta(" ST"), ev.ReasoningDelta("r")] and f.held == "x"
    assert f.apply([ev.ContentDelta("yz")]) == [] and f.matched == "xy" and f.flush() == []
    g = StopFilter(["abc"])
    assert g.apply([ev.ContentDelta("x ab")]) == [ev.ContentDelta("x")] and g.flush() == [ev.ContentDelta(" ab")]
    assert g.apply([ev.ContentDelta("y  a"), ev.ContentDelta("bc")]) == [ev.ContentDelta("y")]
