"""OpenAI routes through the official ``openai`` SDK against a real uvicorn server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from freetoken.server.openai.protocol import ResponsesRequest
from freetoken.server.openai.responses_input import to_internal
from scripted_engine import ScriptedEngine
from server_harness import MODEL, Running, serve

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
R_TOOLS: list[Any] = [{"type": "function", **TOOLS[0]["function"]}]
THINK_AND_CALLS = (
    "<think>\nThe user wants weather.\n</think>\n\nChecking both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def scripted(tokenizer: Any) -> Iterator[Running]:
    """Replies with reasoning and two tool calls (a random model never writes them)."""
    with serve(ScriptedEngine(tokenizer, lambda ids: THINK_AND_CALLS)) as srv:
        yield srv


def client(srv: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def _calls(msg: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]


def test_chat_tool_calls_stream_equals_nonstream(scripted: Running) -> None:
    c = client(scripted)
    kw: dict[str, Any] = dict(model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS)
    full = c.chat.completions.create(**kw, max_tokens=200, temperature=0)
    with c.chat.completions.stream(**kw, max_tokens=200, temperature=0, stream_options={"include_usage": True}) as s:
        streamed = s.get_final_completion()
    for r in (full, streamed):
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        assert m.content == "Checking both."
        assert m.model_extra is not None and m.model_extra["reasoning_content"] == "The user wants weather."
        assert _calls(m) == [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}')]
        assert [tc.id for tc in m.tool_calls or []][0].startswith("call_")
    assert full.usage is not None and streamed.usage is not None
    assert full.usage.model_dump() == streamed.usage.model_dump()
    assert full.usage.completion_tokens == len(scripted.engine.tokenizer.encode(THINK_AND_CALLS)) + 1


def test_chat_stream_chunks_keep_ids_and_indexes(scripted: Running) -> None:
    chunks = list(
        client(scripted).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=200,
        )
    )
    starts = [tc for ch in chunks for choice in ch.choices for tc in choice.delta.tool_calls or [] if tc.id]
    assert [t.index for t in starts] == [0, 1] and len({t.id for t in starts}) == 2
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert len({ch.id for ch in chunks}) == 1


def test_parallel_tool_calls_off_and_tool_choice_none(scripted: Running) -> None:
    c = client(scripted)
    msgs: Any = [{"role": "user", "content": "x"}]
    one = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, parallel_tool_calls=False)
    assert _calls(one.choices[0].message) == [("get_weather", '{"city": "Paris"}')]
    none = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none")
    assert none.choices[0].finish_reason == "stop" and not none.choices[0].message.tool_calls
    assert none.choices[0].message.content == "Checking both."  # the call's markup never leaks (issue 36)


def test_tool_round_trip_reaches_the_prompt(scripted: Running) -> None:
    c = client(scripted)
    first = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w?"}], tools=TOOLS)
    m = first.choices[0].message
    history: Any = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "w?"}]},
        m.model_dump(exclude_none=True),
        *[{"role": "tool", "tool_call_id": tc.id, "content": f"sunny {i}"} for i, tc in enumerate(m.tool_calls or [])],
    ]
    req = {"model": MODEL, "messages": history, "tools": TOOLS}
    n_with = c.chat.completions.create(**req, max_tokens=1).usage
    assert n_with is not None
    gen = scripted.state.generation()
    from freetoken.server.openai.chat_completions import to_internal as chat_internal
    from freetoken.server.openai.protocol import ChatCompletionRequest

    ids = gen.render(chat_internal(ChatCompletionRequest.model_validate(req)))
    text = scripted.engine.tokenizer.decode(ids)
    assert "sunny 0" in text and "sunny 1" in text and '"city": "Oslo"' in text and "Be brief." in text
    assert n_with.prompt_tokens == len(ids)


def test_responses_stream_equals_nonstream_with_reasoning_and_calls(scripted: Running) -> None:
    c = client(scripted)
    full = c.responses.create(model=MODEL, input="weather?", tools=R_TOOLS, instructions="Be brief.")
    with c.responses.stream(model=MODEL, input="weather?", tools=R_TOOLS, instructions="Be brief.") as s:
        events = [e.type for e in s]
        streamed = s.get_final_response()

    def shape(r: Any) -> list[Any]:
        out: list[Any] = []
        for item in r.output:
            if item.type == "reasoning":
                out.append(("reasoning", [p.text for p in item.content or []]))
            elif item.type == "message":
                out.append(("message", [p.text for p in item.content]))
            else:
                out.append((item.type, item.name, item.arguments))
        return out

    assert (
        shape(full)
        == shape(streamed)
        == [
            ("reasoning", ["The user wants weather."]),
            ("message", ["Checking both."]),
            ("function_call", "get_weather", '{"city": "Paris"}'),
            ("function_call", "get_weather", '{"city": "Oslo"}'),
        ]
    )
    assert full.status == streamed.status == "completed"
    assert full.usage is not None and streamed.usage is not None
    assert full.usage.output_tokens == streamed.usage.output_tokens
    assert events[:2] == ["response.created", "response.in_progress"] and events[-1] == "response.completed"
    for kind in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.output_item.done",
        "response.reasoning_text.delta",
    ):
        assert kind in events


def test_responses_custom_tool(tokenizer: Any) -> None:
    patch = "*** Begin Patch\n*** End Patch"
    text = (
        '<tool_call>\n{"name": "apply_patch", "arguments": {"input": '
        + repr(patch).replace("'", '"')
        + "}}\n</tool_call>"
    )
    with serve(ScriptedEngine(tokenizer, lambda ids: text)) as srv:
        c = client(srv)
        tools: Any = [
            {
                "type": "custom",
                "name": "apply_patch",
                "description": "Apply a patch",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
            }
        ]
        full = c.responses.create(model=MODEL, input="fix it", tools=tools)
        with c.responses.stream(model=MODEL, input="fix it", tools=tools) as s:
            streamed = s.get_final_response()
        for r in (full, streamed):
            (item,) = r.output
            assert item.type == "custom_tool_call" and item.name == "apply_patch" and item.input == patch


def test_responses_input_items_convert() -> None:
    body = ResponsesRequest.model_validate(
        {
            "model": MODEL,
            "instructions": "sys",
            "input": [
                {"role": "developer", "content": "dev"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "hmm"}],
                },
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
                {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "r1"}]},
                {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "opaque"},
                {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "PATCH"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
            ],
        }
    )
    req = to_internal(body)
    req.validate()
    assert req.messages == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "dev"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "hmm",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "apply_patch", "arguments": {"input": "PATCH"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
        {"role": "assistant", "content": "done"},
    ]


def test_an_unknown_previous_response_is_a_400(scripted: Running) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(scripted).responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert "previous response 'resp_123' not found" in err.value.message
    assert err.value.status_code == 400


def test_models_list(scripted: Running) -> None:
    models = client(scripted).models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra is not None
    assert models[0].model_extra["context_length"] == scripted.engine.max_model_len
    assert models[0].model_extra["max_model_len"] == scripted.engine.max_model_len
    # A client configured for a cloud model retrieves it and gets the loaded model under its real id, as its
    # generation requests do (a served name answers as itself)
    assert client(scripted).models.retrieve("gpt-4o").id == MODEL
    assert client(scripted).models.retrieve(MODEL).id == MODEL


def test_leading_system_messages_merge() -> None:
    from freetoken.server.internal import merge_leading_system

    msgs = [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "u"},
        {"role": "system", "content": "late"},
    ]
    assert merge_leading_system(msgs) == [{"role": "system", "content": "a\n\nb"}, *msgs[2:]]
    assert merge_leading_system(msgs[1:]) == msgs[1:]
