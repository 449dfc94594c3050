"""The real engine behind the real server: streaming equals non-streaming, concurrency equals solo
runs (greedy), and a client that vanishes mid-stream leaves every cache intact."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from server_harness import MODEL, Running, real_engine, serve, tiny_checkpoint

N_TOKENS = 8
GREEDY = {"temperature": 0}  # anthropic 2.x dropped the temperature argument
PROMPTS = [f"Question {i}: what is {i} plus {i * 3}?" for i in range(12)]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    model = tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")))
    with serve(real_engine(model, max_running_requests=4, max_model_len=512)) as s:
        yield s


def oai(srv: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)


def ant(srv: Running) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0)


def _msgs(p: str) -> Any:
    return [{"role": "user", "content": p}]


def _assert_aborted(srv: Running, before: int) -> None:
    """The request whose client went away stops running well before its 400 tokens; the engine is intact."""
    deadline = time.time() + 30
    while srv.state.metrics.requests_running and time.time() < deadline:
        time.sleep(0.05)
    assert srv.state.metrics.requests_running == 0
    assert srv.state.metrics.generated_tokens_total - before < 400
    srv.engine.check_integrity()


def test_all_three_apis_stream_equals_nonstream(srv: Running) -> None:
    c, a = oai(srv), ant(srv)
    kw: dict[str, Any] = dict(model=MODEL, messages=_msgs(PROMPTS[0]), temperature=0)
    full = c.chat.completions.create(**kw, max_tokens=N_TOKENS)
    with c.chat.completions.stream(**kw, max_tokens=N_TOKENS, stream_options={"include_usage": True}) as s:
        for _ in s:
            pass
        # get_final_completion() refuses finish_reason "length" (a random model rarely stops on its
        # own); the snapshot is the same accumulator's result.
        streamed = s.current_completion_snapshot
    m1, m2 = full.choices[0].message, streamed.choices[0].message
    assert (m1.content, m1.model_extra) == (m2.content, m2.model_extra)
    assert full.choices[0].finish_reason == streamed.choices[0].finish_reason
    assert full.usage is not None and streamed.usage is not None
    # the repeated prompt is served from the prefix cache the second time: only cached_tokens may differ
    u1, u2 = full.usage.model_dump(), streamed.usage.model_dump()
    assert u2["prompt_tokens_details"].pop("cached_tokens") > u1["prompt_tokens_details"].pop("cached_tokens")
    assert u1 == u2
    assert full.usage.completion_tokens == N_TOKENS or full.choices[0].finish_reason == "stop"

    rkw: dict[str, Any] = dict(model=MODEL, input=PROMPTS[0], temperature=0, max_output_tokens=N_TOKENS)
    r1 = c.responses.create(**rkw)
    with c.responses.stream(**rkw) as s:
        events = list(s)
    # Hitting max_output_tokens ends with `response.incomplete` (as OpenAI does), which
    # get_final_response() does not accept; the SDK's text accumulator and that event carry the answer.
    text = [e.snapshot for e in events if e.type == "response.output_text.delta"][-1]  # type: ignore[union-attr]
    last = events[-1]
    assert last.type == ("response.incomplete" if r1.status == "incomplete" else "response.completed")
    r2 = last.response  # type: ignore[union-attr]
    assert r1.output_text == text == r2.output_text and r1.status == r2.status
    assert r1.usage is not None and r2.usage is not None and r1.usage.output_tokens == r2.usage.output_tokens

    akw: dict[str, Any] = dict(model=MODEL, messages=_msgs(PROMPTS[0]), extra_body=GREEDY, max_tokens=N_TOKENS)
    a1 = a.messages.create(**akw)
    with a.messages.stream(**akw) as s:
        a2 = s.get_final_message()
    assert [b.model_dump() for b in a1.content] == [b.model_dump() for b in a2.content]
    assert (a1.stop_reason, a1.usage.output_tokens) == (a2.stop_reason, a2.usage.output_tokens)
    # Anthropic counts prefix-cache reads apart from input_tokens; together they are the whole prompt
    total = a.messages.count_tokens(model=MODEL, messages=_msgs(PROMPTS[0])).input_tokens
    assert a1.usage.input_tokens + a1.usage.cache_read_input_tokens == total
    assert a1.usage.cache_read_input_tokens > 0  # the same prompt ran above: its pages were reused


async def _stream_chat(c: openai.AsyncOpenAI, prompt: str) -> str:
    parts = []
    stream = await c.chat.completions.create(
        model=MODEL, messages=_msgs(prompt), temperature=0, max_tokens=N_TOKENS, stream=True
    )
    async for chunk in stream:
        for ch in chunk.choices:
            parts.append((ch.delta.content or "") + (getattr(ch.delta, "reasoning_content", None) or ""))
    return "".join(parts)


async def _stream_messages(a: anthropic.AsyncAnthropic, prompt: str) -> str:
    async with a.messages.stream(model=MODEL, messages=_msgs(prompt), extra_body=GREEDY, max_tokens=N_TOKENS) as s:
        m = await s.get_final_message()
    return "".join(getattr(b, "text", "") + getattr(b, "thinking", "") for b in m.content)


def test_concurrent_streams_equal_solo_runs(srv: Running) -> None:
    """12 streaming clients at once (4 run, 8 queue) get what each gets alone."""
    c = oai(srv)
    a = ant(srv)
    solo = []
    for i, p in enumerate(PROMPTS):
        if i % 2 == 0:
            m = c.chat.completions.create(model=MODEL, messages=_msgs(p), temperature=0, max_tokens=N_TOKENS)
            solo.append(
                (m.choices[0].message.content or "")
                + (m.choices[0].message.model_extra or {}).get("reasoning_content", "")
            )
        else:
            am = a.messages.create(model=MODEL, messages=_msgs(p), extra_body=GREEDY, max_tokens=N_TOKENS)
            solo.append("".join(getattr(b, "text", "") + getattr(b, "thinking", "") for b in am.content))

    async def together() -> list[str]:
        ac = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
        aa = anthropic.AsyncAnthropic(base_url=srv.url, api_key="k", max_retries=0)
        jobs = [_stream_chat(ac, p) if i % 2 == 0 else _stream_messages(aa, p) for i, p in enumerate(PROMPTS)]
        return list(await asyncio.gather(*jobs))

    assert asyncio.run(together()) == solo
    srv.engine.check_integrity()


def test_client_killed_mid_stream(srv: Running) -> None:
    before = srv.state.metrics.generated_tokens_total
    body = {
        "model": MODEL,
        "messages": _msgs(PROMPTS[1]),
        "max_tokens": 400,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
    # The connection is gone: the request must be aborted, not run to 400 tokens.
    _assert_aborted(srv, before)
    m = oai(srv).chat.completions.create(model=MODEL, messages=_msgs("still there?"), max_tokens=2)
    assert m.choices[0].message.content is not None


def test_metrics_and_stats(srv: Running) -> None:
    oai(srv).chat.completions.create(model=MODEL, messages=_msgs("hi"), max_tokens=2)
    text = httpx.get(srv.url + "/metrics").text
    for name in (
        "freetoken_up 1.0",
        "freetoken_generated_tokens_total",
        "freetoken_time_to_first_token_seconds_count",
        "freetoken_generation_tokens_per_second",
        "freetoken_kv_pages_occupancy",
        "freetoken_engine_waiting",
    ):
        assert name in text
    stats = httpx.get(srv.url + "/v1/engine/stats").json()
    assert stats["state"] == "ready" and stats["server"]["requests_total"] > 0 and stats["engine"]


def test_non_streaming_client_gone_aborts(srv: Running) -> None:
    before = srv.state.metrics.generated_tokens_total
    body = {"model": MODEL, "max_tokens": 400, "ignore_eos": True, "messages": _msgs(PROMPTS[2])}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(5.0, read=0.2))
    _assert_aborted(srv, before)


def test_failed_step_mid_stream_is_an_error_event_and_the_engine_serves_on(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A step that fails outside any one request ends the stream with an error event; the engine lives
    on while its caches are sound, and dies (5xx, /health says why) only when they are not."""
    model = tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_dies")))
    with serve(real_engine(model, max_model_len=256)) as s:
        inner = s.engine.engine
        real_step, calls = inner.step, [0]

        def failing_step() -> Any:  # fault injection: the 5th step raises inside the engine thread
            calls[0] += 1
            if calls[0] == 5:
                raise RuntimeError("injected device fault")
            return real_step()

        inner.step = failing_step
        body = {"model": MODEL, "max_tokens": 50, "ignore_eos": True, "stream": True, "messages": _msgs("hi")}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines = [ln for ln in r.iter_lines() if ln]
        assert "injected device fault" in lines[-2] and lines[-1] == "data: [DONE]"
        assert '"error"' in lines[-2]
        assert httpx.get(s.url + "/health").status_code == 200
        ok = httpx.post(s.url + "/v1/messages", json={**body, "stream": False, "max_tokens": 3}, timeout=30)
        assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] == 3

        def broken_caches() -> None:
            raise AssertionError("KV pages leaked")

        calls[0] = 0
        inner.check_integrity = broken_caches
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines = [ln for ln in r.iter_lines() if ln]
        assert "injected device fault" in lines[-2] and lines[-1] == "data: [DONE]"
        health = httpx.get(s.url + "/health")
        assert health.status_code == 503 and "KV pages leaked" in health.json()["error"]
        r2 = httpx.post(s.url + "/v1/messages", json={**body, "stream": False}, timeout=30)
        assert r2.status_code == 500 and r2.json()["error"]["type"] == "api_error"


def test_seed_and_stop_reach_the_engine(srv: Running) -> None:
    c = oai(srv)

    def sample(seed: int) -> str:
        m = c.chat.completions.create(
            model=MODEL, messages=_msgs("Tell me"), temperature=1.0, seed=seed, max_tokens=N_TOKENS
        )
        return m.choices[0].message.content or ""

    a, b = sample(7), sample(7)
    assert a == b and any(sample(s) != a for s in (8, 9, 10))
    greedy = c.chat.completions.create(model=MODEL, messages=_msgs("Tell me"), temperature=0, max_tokens=N_TOKENS)
    text = greedy.choices[0].message.content or ""
    stop = next(text[i : i + 2] for i in range(len(text) // 2, len(text) - 1) if text[i : i + 2].strip())
    cut = c.chat.completions.create(
        model=MODEL, messages=_msgs("Tell me"), temperature=0, max_tokens=N_TOKENS, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)].rstrip()
