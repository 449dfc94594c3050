"""Any model name is answered by the loaded model (the response names its real id), and parts this model cannot
read (images, audio, files; Anthropic image and document blocks) are a 400 in each API's shape naming the part,
through the real openai and anthropic SDKs against the real server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from scripted_engine import ScriptedEngine
from server_harness import MODEL, Running, serve


@pytest.fixture(scope="module")
def srv(tokenizer: Any) -> Iterator[Running]:
    with serve(ScriptedEngine(tokenizer, max_model_len=256, script=lambda ids: "hello world")) as s:
        yield s


def _clients(srv: Running) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    return (openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0),
            anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0))  # fmt: skip


@pytest.mark.parametrize("name", ["gpt-4o", "claude-sonnet-4-5", "", MODEL])
def test_any_model_name_is_answered_by_the_loaded_model(srv: Running, name: str) -> None:
    oa, an = _clients(srv)
    msgs: Any = [{"role": "user", "content": "hi"}]
    chat = oa.chat.completions.create(model=name, messages=msgs, max_tokens=4)
    assert chat.model == MODEL and chat.choices[0].message.content == "hello world"
    chunks = list(oa.chat.completions.create(model=name, messages=msgs, max_tokens=4, stream=True))
    assert {c.model for c in chunks} == {MODEL}
    resp = oa.responses.create(model=name, input="hi", max_output_tokens=4)
    assert resp.model == MODEL and resp.output_text == "hello world"
    msg = an.messages.create(model=name, max_tokens=4, messages=msgs)
    assert msg.model == MODEL and msg.content[0].text == "hello world"  # type: ignore[union-attr]
    with an.messages.stream(model=name, max_tokens=4, messages=msgs) as st:
        assert st.get_final_message().model == MODEL
    assert an.messages.count_tokens(model=name, messages=msgs).input_tokens > 0


OPENAI_PARTS: list[tuple[str, dict[str, Any]]] = [
    ("image_url", {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}),
    ("input_audio", {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
    ("file", {"type": "file", "file": {"file_data": "data:application/pdf;base64,AAAA", "filename": "a.pdf"}}),
]


@pytest.mark.parametrize("kind,part", OPENAI_PARTS, ids=[p[0] for p in OPENAI_PARTS])
@pytest.mark.parametrize("stream", [False, True])
def test_unreadable_openai_parts_are_refused_naming_the_part(srv: Running, kind: str, part: Any, stream: bool) -> None:
    oa, _ = _clients(srv)
    msgs: Any = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, stream=stream)
    body: Any = err.value.body
    assert kind in body["message"] and body["param"] == "messages.0.content.1", body
    assert body["type"] == "invalid_request_error"
    assert oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)


@pytest.mark.parametrize("kind", ["input_image", "input_file", "input_audio"])
def test_unreadable_responses_parts_are_refused(srv: Running, kind: str) -> None:
    oa, _ = _clients(srv)
    item: Any = {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                             {"type": kind, "image_url": "data:image/png;base64,AAAA"}]}  # fmt: skip
    with pytest.raises(openai.BadRequestError) as err:
        oa.responses.create(model=MODEL, input=[item], max_output_tokens=4)
    assert kind in str(err.value) and "input.0.content.1" in str(err.value)


ANTHROPIC_BLOCKS: list[tuple[str, dict[str, Any]]] = [
    ("image", {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}),
    ("document", {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "AA=="}}),
]


@pytest.mark.parametrize("kind,block", ANTHROPIC_BLOCKS, ids=[b[0] for b in ANTHROPIC_BLOCKS])
def test_unreadable_anthropic_blocks_are_refused_naming_the_block(srv: Running, kind: str, block: Any) -> None:
    _, an = _clients(srv)
    msgs: Any = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, block]}]
    with pytest.raises(anthropic.BadRequestError) as err:
        an.messages.create(model=MODEL, max_tokens=4, messages=msgs)
    body: Any = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert kind in body["error"]["message"] and "messages.0.content.1" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        with an.messages.stream(model=MODEL, max_tokens=4, messages=msgs) as st:
            st.get_final_message()
    r = httpx.post(srv.url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": msgs})
    assert r.status_code == 400 and kind in r.json()["error"]["message"]
    assert an.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]).content
