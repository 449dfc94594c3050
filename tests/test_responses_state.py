"""Responses: reasoning tokens counted, reasoning summaries, and the bounded store behind
previous_response_id and GET /v1/responses/{id}, through the real server and the OpenAI SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from freetoken.server.settings import ServerConfig
from scripted_engine import ScriptedEngine
from server_harness import MODEL, Running, serve

THINK = "<think>\nThe user wants weather.\n</think>\n\n"
REPLY = THINK + "It is sunny."


@pytest.fixture(scope="module")
def srv(tokenizer: Any) -> Iterator[Running]:
    """Replies with a think block and a sentence; echoes what it saw of the prompt on request."""

    def script(ids: list[int]) -> str:
        prompt = tokenizer.decode(ids, skip_special_tokens=False)
        return "SAW:" + str(prompt.count("It is sunny.")) if "again" in prompt else REPLY

    with serve(ScriptedEngine(tokenizer, script), ServerConfig(served_model_names=(MODEL,), responses_store=2)) as s:
        yield s


def client(srv: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def test_reasoning_tokens_are_counted(srv: Running, tokenizer: Any) -> None:
    r = client(srv).responses.create(model=MODEL, input="weather?")
    assert r.usage is not None
    think_close = tokenizer.encode(THINK, add_special_tokens=False)  # up to and including </think>
    close_at = think_close.index(tokenizer.convert_tokens_to_ids("</think>"))
    assert r.usage.output_tokens_details.reasoning_tokens == close_at + 1
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    chat = client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "weather?"}])
    assert chat.usage is not None and chat.usage.completion_tokens_details is not None
    assert chat.usage.completion_tokens_details.reasoning_tokens == close_at + 1


def test_reasoning_summary_is_honoured_and_echoed(srv: Running) -> None:
    c = client(srv)
    with c.responses.stream(model=MODEL, input="weather?", reasoning={"effort": "low", "summary": "auto"}) as s:
        kinds = [e.type for e in s]
        r = s.get_final_response()
    assert "response.reasoning_summary_text.delta" in kinds and "response.reasoning_text.delta" not in kinds
    assert "response.reasoning_summary_part.added" in kinds and "response.reasoning_summary_part.done" in kinds
    (reasoning, message) = r.output
    assert reasoning.type == "reasoning" and [p.text for p in reasoning.summary] == ["The user wants weather."]
    assert r.reasoning is not None and (r.reasoning.effort, r.reasoning.summary) == ("low", "auto")
    plain = c.responses.create(model=MODEL, input="weather?")
    assert plain.output[0].type == "reasoning" and plain.output[0].summary == []
    assert plain.output[0].content is not None and plain.output[0].content[0].text == "The user wants weather."


def test_previous_response_id_continues_a_stored_response(srv: Running) -> None:
    c = client(srv)
    first = c.responses.create(model=MODEL, input="weather?")
    assert first.store is True
    got = httpx.get(f"{srv.url}/v1/responses/{first.id}").json()
    assert got["id"] == first.id and got["output"][1]["content"][0]["text"] == "It is sunny."
    # the stored turn is in the prompt of the next one: the model sees its own earlier answer
    second = c.responses.create(model=MODEL, input="again?", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.output_text == "SAW:1"
    third = c.responses.create(model=MODEL, input="again?", previous_response_id=second.id, stream=False)
    assert third.output_text == "SAW:1"  # first's answer, through second
    # bounded: a fourth response pushes out the least recently used
    c.responses.create(model=MODEL, input="weather?")
    assert httpx.get(f"{srv.url}/v1/responses/{first.id}").status_code == 404
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model=MODEL, input="again?", previous_response_id=first.id)


def test_store_false_keeps_nothing(srv: Running) -> None:
    r = client(srv).responses.create(model=MODEL, input="weather?", store=False)
    assert r.store is False
    missing = httpx.get(f"{srv.url}/v1/responses/{r.id}")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_streamed_responses_are_stored_too(srv: Running) -> None:
    c = client(srv)
    with c.responses.stream(model=MODEL, input="weather?") as s:
        r = s.get_final_response()
    assert httpx.get(f"{srv.url}/v1/responses/{r.id}").json()["status"] == "completed"
