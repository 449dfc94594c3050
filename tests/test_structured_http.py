"""Structured output through the real server and the official SDKs: forced tool calls (OpenAI named and
required, Anthropic tool and any, Responses), JSON answers, custom tools' grammars, with the embedded
default model and a random tiny model. Every answer must carry a call of an allowed tool whose
arguments validate against its schema, or JSON that validates, with no markup in the content.
(`ft bench structured` sends 50 of each; docs/benchmarks.md has its figures.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from freetoken.bench.structured_cases import MARKUP, SCHEMAS, TOOLS, cases
from freetoken.server.settings import ServerConfig
from server_harness import Running, real_engine, serve

N = 3  # requests per mode here; the benchmark sends 50
SCHEMA = {t["name"]: t["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def default_srv() -> Iterator[Running]:
    from freetoken.config import EngineConfig
    from freetoken.engine.async_llm import AsyncLLM

    cfg = EngineConfig(device="cpu", max_running_requests=8)
    with serve(lambda: AsyncLLM.start(cfg), ServerConfig(served_model_names=("ft",))) as srv:
        yield srv


def _no_markup(text: str | None) -> None:
    assert not text or not any(m in text for m in MARKUP), text


@pytest.mark.parametrize("mode", ["openai-named", "openai-required", "anthropic-tool", "anthropic-any", "json-schema"])
def test_every_forced_answer_validates(default_srv: Running, mode: str) -> None:
    client = httpx.Client(base_url=default_srv.url, timeout=300)
    for case in cases(mode, N, "ft", 256):
        r = client.post(case.path, json=case.body)
        assert r.status_code == 200, r.text
        assert case.check(r.json()) == "", (case.body, r.json())


def test_forced_calls_through_the_sdks_streamed_and_not(default_srv: Running) -> None:
    oa = openai.OpenAI(base_url=default_srv.url + "/v1", api_key="x", max_retries=0)
    tools: Any = [{"type": "function", "function": t} for t in TOOLS]
    msgs: Any = [{"role": "user", "content": "Hello!"}]  # a greeting: left alone, the model answers in text
    choice: Any = {"type": "function", "function": {"name": "set_alarm"}}
    full = oa.chat.completions.create(model="ft", messages=msgs, tools=tools, tool_choice=choice, seed=3)
    (call,) = full.choices[0].message.tool_calls or []
    assert full.choices[0].finish_reason == "tool_calls" and call.function.name == "set_alarm"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA["set_alarm"])  # type: ignore[union-attr]
    _no_markup(full.choices[0].message.content)
    chunks = list(oa.chat.completions.create(model="ft", messages=msgs, tools=tools, tool_choice="required",
                                             stream=True, seed=3))  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    names = [tc.function.name for tc in calls if tc.function and tc.function.name]
    assert names and all(n in SCHEMA for n in names) and chunks[-1].choices[0].finish_reason == "tool_calls"
    _no_markup("".join(d.content or "" for d in deltas))
    if len(names) == 1:
        jsonschema.validate(json.loads("".join(tc.function.arguments or "" for tc in calls if tc.function)),
                            SCHEMA[names[0]])  # fmt: skip

    an = anthropic.Anthropic(base_url=default_srv.url, api_key="x", max_retries=0)
    a_tools: Any = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                    for t in TOOLS]  # fmt: skip
    one: Any = {"type": "tool", "name": "read_file"}
    with an.messages.stream(model="ft", max_tokens=256, tools=a_tools, tool_choice=one,
                            messages=[{"role": "user", "content": "Hi there"}]) as s:  # fmt: skip
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and [b.name for b in uses] == ["read_file"]
    jsonschema.validate(uses[0].input, SCHEMA["read_file"])
    _no_markup("".join(b.text for b in final.content if b.type == "text"))


def test_json_answers_through_chat_responses_and_messages(default_srv: Running) -> None:
    schema = SCHEMAS[3]
    oa = openai.OpenAI(base_url=default_srv.url + "/v1", api_key="x", max_retries=0)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "mood", "schema": schema, "strict": True}}
    chat = oa.chat.completions.create(model="ft", messages=[{"role": "user", "content": "How are you?"}],
                                      response_format=fmt)  # fmt: skip
    jsonschema.validate(json.loads(chat.choices[0].message.content or ""), schema)
    obj = oa.chat.completions.create(model="ft", messages=[{"role": "user", "content": "Hi"}],
                                     response_format={"type": "json_object"}, max_tokens=200, seed=0)  # fmt: skip
    text = obj.choices[0].message.content or ""
    assert text.startswith("{") and (obj.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict))
    r = oa.responses.create(model="ft", input="How are you?",
                            text={"format": {"type": "json_schema", "name": "mood", "schema": schema}})  # type: ignore[typeddict-item]  # fmt: skip
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"  # type: ignore[union-attr]
    m = httpx.post(default_srv.url + "/v1/messages", json={
        "model": "ft", "max_tokens": 256, "messages": [{"role": "user", "content": "How are you?"}],
        "output_format": {"type": "json_schema", "schema": schema}}, timeout=300).json()  # fmt: skip
    jsonschema.validate(json.loads(m["content"][-1]["text"]), schema)


def test_responses_forced_function_and_custom_tool_grammar(default_srv: Running) -> None:
    oa = openai.OpenAI(base_url=default_srv.url + "/v1", api_key="x", max_retries=0)
    digits: Any = {"type": "custom", "name": "pin", "description": "Enter a PIN",
                   "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]{4}"}}  # fmt: skip
    fn: Any = {"type": "function", **TOOLS[1]}
    pin: Any = {"type": "custom", "name": "pin"}
    r = oa.responses.create(model="ft", input="Unlock it", tools=[digits, fn], tool_choice=pin)
    (item,) = [o for o in r.output if o.type != "reasoning"]
    assert item.type == "custom_tool_call" and len(item.input) == 4 and item.input.isdigit(), item
    r = oa.responses.create(model="ft", input="Unlock it", tools=[digits, fn], tool_choice="required")
    assert any(o.type in ("custom_tool_call", "function_call") for o in r.output)
    # (a Lark input cannot be checked inside the default model's JSON calls; a regex can, and a bad one is refused)
    bad: Any = {**digits, "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9"}}
    with pytest.raises(openai.BadRequestError, match="invalid grammar"):
        oa.responses.create(model="ft", input="x", tools=[bad], tool_choice=pin)
    with pytest.raises(openai.BadRequestError, match="lark or regex"):
        oa.responses.create(model="ft", input="x", tools=[{**digits, "format": {"type": "grammar", "syntax": "ebnf",
                                                                                "definition": "x"}}])  # fmt: skip


@pytest.fixture(scope="module")
def random_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    from tiny_models import save_checkpoint

    d = Path(tmp_path_factory.mktemp("structured"))
    save_checkpoint("qwen3_moe", d, seed=0, tokenizer=True)
    cfg = json.loads((d / "config.json").read_text())  # 512 positions: the tool prompts alone fill most of them
    (d / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 4096}))
    with serve(real_engine(str(d), max_running_requests=8), ServerConfig(served_model_names=("rnd",))) as srv:
        yield srv


@pytest.mark.parametrize("mode", ["openai-named", "openai-required", "anthropic-tool", "anthropic-any", "json-schema"])
def test_a_random_model_is_forced_too(random_srv: Running, mode: str) -> None:
    """A random model never writes a call or JSON by itself; with bounded arguments the grammar alone
    makes every answer valid (its tags are plain added tokens here, not special ones)."""
    client = httpx.Client(base_url=random_srv.url, timeout=300)
    for case in cases(mode, N, "rnd", 400, bounded=True):
        r = client.post(case.path, json=case.body)
        assert r.status_code == 200, r.text
        assert case.check(r.json()) == "", r.json()


def test_a_forced_call_cut_by_the_length_limit_is_not_content(random_srv: Running) -> None:
    oa = openai.OpenAI(base_url=random_srv.url + "/v1", api_key="x", max_retries=0)
    tools: Any = [{"type": "function", "function": t} for t in TOOLS]
    choice: Any = {"type": "function", "function": {"name": "set_alarm"}}
    r = oa.chat.completions.create(model="rnd", messages=[{"role": "user", "content": "hi"}], tools=tools,
                                   tool_choice=choice, max_tokens=6, seed=1)  # fmt: skip
    assert r.choices[0].finish_reason == "length"
    assert not r.choices[0].message.content and not r.choices[0].message.tool_calls
