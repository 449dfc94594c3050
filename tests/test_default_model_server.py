"""Tool-call and thinking round trips through both SDKs with the embedded default model (it really emits them)."""

from __future__ import annotations

import json

import pytest

from freetoken.loader.model_setup import default_model_path
from freetoken.server.settings import ServerConfig
from server_harness import real_engine, serve

NAME = "freetoken-default"
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name."}},
        "required": ["city"],
    },
}

RESULT = {"city": "Paris", "temperature": 21, "unit": "celsius", "condition": "sunny"}


@pytest.fixture(scope="module")
def server():
    with serve(real_engine(str(default_model_path())), ServerConfig(served_model_names=(NAME,))) as running:
        yield running


def test_openai_tool_call_round_trip(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    tools = [{"type": "function", "function": WEATHER}]
    messages: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=NAME, messages=messages, tools=tools, temperature=0, max_tokens=96)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    call = msg.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert msg.reasoning_content  # the model thinks before it calls
    # the SDK's stream accumulator rebuilds the same call
    with client.chat.completions.stream(
        model=NAME, messages=messages, tools=tools, temperature=0, max_tokens=96
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    messages += [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": msg.reasoning_content,
            "tool_calls": [call.model_dump()],
        },
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(RESULT)},
    ]
    r2 = client.chat.completions.create(model=NAME, messages=messages, tools=tools, temperature=0, max_tokens=96)
    assert r2.choices[0].finish_reason == "stop"
    assert "21" in (r2.choices[0].message.content or "")


def test_anthropic_tool_use_round_trip(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="x")
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    messages: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.messages.create(model=NAME, max_tokens=96, messages=messages, tools=tools, extra_body={"temperature": 0})
    assert r.stop_reason == "tool_use"
    use = next(b for b in r.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in r.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": json.dumps(RESULT)}]},
    ]
    r2 = client.messages.create(
        model=NAME, max_tokens=96, messages=messages, tools=tools, extra_body={"temperature": 0}
    )
    assert r2.stop_reason == "end_turn"
    assert "21" in "".join(b.text for b in r2.content if b.type == "text")


def test_thinking_round_trip_both_sdks(server):
    import anthropic
    import openai

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    r = oa.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "What is 23 + 19?"}], temperature=0, max_tokens=128
    )
    assert "42" in (r.choices[0].message.content or "")
    assert r.choices[0].message.reasoning_content and "</think>" not in r.choices[0].message.content
    an = anthropic.Anthropic(base_url=server.url, api_key="x")
    with an.messages.stream(
        model=NAME,
        max_tokens=128,
        extra_body={"temperature": 0},
        thinking={"type": "enabled", "budget_tokens": 64},
        messages=[{"role": "user", "content": "What is 23 + 19?"}],
    ) as stream:
        final = stream.get_final_message()
    kinds = [b.type for b in final.content]
    assert kinds[0] == "thinking" and "text" in kinds
    assert "42" in "".join(b.text for b in final.content if b.type == "text")
