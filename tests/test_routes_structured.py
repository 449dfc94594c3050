"""Structured output that behaves, through the real openai and anthropic SDKs against the real server on
loopback, with a tiny random model (near uniform over the tokens the grammar allows: the hardest writer of JSON to
finish, and one that writes every markup tag it is not kept from): a JSON-schema (strings bounded by ``maxLength``)
or ``json_object`` answer that ends with ``stop`` always parses, and at least 90% of 50 seeded requests with enough
``max_tokens`` end so; an answer cut by the budget says ``length``; ``tool_choice: "none"`` never leaks tool,
reasoning or chat markup into the content (the random model writes the tags; a scripted engine writes whole calls)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from freetoken.bench.structured_cases import MARKUP
from freetoken.server.settings import ServerConfig
from scripted_engine import ScriptedEngine
from server_harness import Running, real_engine, serve, tiny_checkpoint

N = 50
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age"],
}
PROMPTS = ["Describe a person as JSON.", "Give me a user record.", "Who won? Answer in JSON.", "A cat's profile.",
           "Return a JSON object about Paris."]  # fmt: skip
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    model = tiny_checkpoint(str(tmp_path_factory.mktemp("structured")))
    engine = real_engine(model, max_running_requests=8, max_model_len=512)
    with serve(engine, ServerConfig(served_model_names=("ft",))) as s:
        yield s
        s.engine.check_integrity()


def _oa(srv: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0, timeout=300)


def _many(srv: Running, fmt: Any, max_tokens: int, n: int = N) -> list[tuple[str, str]]:
    """(finish reason, content) of ``n`` seeded requests, eight at a time."""
    oa = _oa(srv)

    def one(i: int) -> tuple[str, str]:
        msgs: Any = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
        r = oa.chat.completions.create(model="gpt-4o", messages=msgs, response_format=fmt, max_tokens=max_tokens,
                                       seed=i, temperature=1.0)  # fmt: skip
        return r.choices[0].finish_reason, r.choices[0].message.content or ""

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def _check(results: list[tuple[str, str]], schema: dict[str, Any]) -> None:
    stopped = [content for finish, content in results if finish == "stop"]
    assert len(stopped) >= 0.9 * len(results), [f for f, _ in results]
    for content in stopped:
        jsonschema.validate(json.loads(content), schema)
    assert {f for f, _ in results} <= {"stop", "length"}


def test_json_schema_answers_that_stop_always_parse(srv: Running) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    _check(_many(srv, fmt, 160), SCHEMA)


def test_json_object_answers_that_stop_always_parse(srv: Running) -> None:
    _check(_many(srv, {"type": "json_object"}, 480), {"type": "object"})  # keys, strings, lists: bounded


def test_a_json_answer_cut_by_the_budget_says_length(srv: Running) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    for finish, content in _many(srv, fmt, 3, n=4):
        assert finish == "length"
        with pytest.raises(json.JSONDecodeError):
            json.loads(content)
    an = anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0)
    m = an.messages.create(model="claude-sonnet-4-5", max_tokens=3, messages=[{"role": "user", "content": "JSON"}],
                           extra_body={"output_format": {"type": "json_schema", "schema": SCHEMA}})  # fmt: skip
    assert m.stop_reason == "max_tokens"
    with pytest.raises(openai.BadRequestError, match="stop sequences cannot be combined"):
        _oa(srv).chat.completions.create(model="ft", messages=[{"role": "user", "content": "x"}], stop=["}"],
                                         response_format={"type": "json_object"})  # fmt: skip


def _no_markup(text: str) -> bool:
    return not any(m in text for m in MARKUP)


def test_tool_choice_none_never_leaks_markup(srv: Running) -> None:
    oa = _oa(srv)

    def one(i: int) -> tuple[str, Any]:
        msgs: Any = [{"role": "user", "content": ["What's the weather in Paris?", "Rome please?", "hi"][i % 3]}]
        r = oa.chat.completions.create(model="ft", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=48,
                                       seed=i)  # fmt: skip
        return r.choices[0].message.content or "", r.choices[0].message.tool_calls

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(N)))
    assert all(_no_markup(c) and not calls for c, calls in results), [c for c, _ in results if not _no_markup(c)]


LEAKY = ('<think>\nhmm\n</think>\n\nSure </think> here.<tool_call>\n{"name": "get_weather", "arguments": {}}\n'
         "</tool_call> done<|im_start|>")


@pytest.mark.parametrize("stream", [False, True])
def test_a_whole_call_and_stray_tags_never_reach_the_content(tokenizer: Any, stream: bool) -> None:
    with serve(ScriptedEngine(tokenizer, lambda ids: LEAKY, step_s=0.0)) as s:
        oa = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        msgs: Any = [{"role": "user", "content": "weather?"}]
        if not stream:
            r = oa.chat.completions.create(model="x", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=200)
            m = r.choices[0].message
            content, calls, finish = m.content or "", m.tool_calls, r.choices[0].finish_reason
        else:
            content, calls, finish = "", None, ""
            for ch in oa.chat.completions.create(model="x", messages=msgs, tools=TOOLS, tool_choice="none",
                                                 max_tokens=200, stream=True):  # fmt: skip
                content += ch.choices[0].delta.content or ""
                calls = calls or ch.choices[0].delta.tool_calls
                finish = ch.choices[0].finish_reason or finish
        assert _no_markup(content) and "Sure" in content and "done" in content and not calls and finish == "stop"
