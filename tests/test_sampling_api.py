"""The sampling fields over HTTP (issue 19): penalties and min-p reach the sampler, logprobs come back in
OpenAI's shape (streamed and not, through the SDK too), and a field the server cannot honour is a 400."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from freetoken.server.settings import ServerConfig
from server_harness import MODEL, Running, real_engine, serve, tiny_checkpoint

CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": "hi there"}]}  # fmt: skip


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    model = tiny_checkpoint(str(tmp_path_factory.mktemp("sampling_api")))
    with serve(real_engine(model, max_model_len=256), ServerConfig(served_model_names=(MODEL,))) as s:
        yield s


def _ids(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [c["token"] for c in r.json()["choices"][0]["logprobs"]["content"]]


def test_penalties_change_a_greedy_answer(srv: Running) -> None:
    base = httpx.post(srv.url + CHAT, json={**BODY, "logprobs": True}, timeout=60)
    tokens = _ids(base)
    assert len(set(tokens)) < len(tokens)  # the tiny random model repeats itself
    for extra in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 3.0}):
        pen = _ids(httpx.post(srv.url + CHAT, json={**BODY, "logprobs": True, **extra}, timeout=60))
        assert pen != tokens, extra
        if "repetition_penalty" not in extra:
            assert len(set(pen)) > len(set(tokens)), extra
    same = httpx.post(srv.url + CHAT, json={**BODY, "min_p": 0.5, "temperature": 1.0, "seed": 3}, timeout=60)
    assert same.status_code == 200


def test_logprobs_in_openai_shape(srv: Running) -> None:
    r = httpx.post(srv.url + CHAT, json={**BODY, "logprobs": True, "top_logprobs": 3}, timeout=60).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"]
    for c in content:
        assert len(c["top_logprobs"]) == 3 and c["logprob"] <= 0 and isinstance(c["bytes"], list)
        assert math.isclose(c["logprob"], c["top_logprobs"][0]["logprob"], rel_tol=1e-5)  # greedy: the best
        assert c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"]
    assert httpx.post(srv.url + CHAT, json=BODY, timeout=60).json()["choices"][0]["logprobs"] is None
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
    kw: dict[str, Any] = {"model": MODEL, "messages": BODY["messages"], "max_tokens": 8, "temperature": 0}
    done = client.chat.completions.create(**kw, logprobs=True, top_logprobs=2)
    streamed: list[Any] = []
    for ch in client.chat.completions.create(**kw, logprobs=True, top_logprobs=2, stream=True):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            streamed += ch.choices[0].logprobs.content
    assert done.choices[0].logprobs is not None and done.choices[0].logprobs.content is not None
    assert [c.token for c in streamed] == [c.token for c in done.choices[0].logprobs.content]


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"best_of": 3}, "best_of"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
    ],
)
def test_fields_we_cannot_honour_are_400(srv: Running, extra: dict[str, Any], param: str) -> None:
    r = httpx.post(srv.url + CHAT, json={**BODY, **extra}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_responses_refuses_logprobs(srv: Running) -> None:
    r = httpx.post(srv.url + "/v1/responses", json={"model": MODEL, "input": "hi", "top_logprobs": 3}, timeout=60)
    assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"]
