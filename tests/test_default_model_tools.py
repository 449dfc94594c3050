"""Issue #3's acceptance test: the embedded default model calls tools through the real server.

For the 50 held-out tool prompts (`training/default_model/generate.heldout_tool_prompts`: cities,
paths and expressions never seen in training, tool names and parameter names drawn per prompt) the
server must return a call that names the right tool from the request's own tool list with exactly
the expected arguments in >= 90% of cases, through OpenAI `message.tool_calls` and through
Anthropic `tool_use` blocks; for the 50 held-out prompts that need no tool (tools still offered)
at most 10% may come back as tool calls. Greedy decoding, the official SDK clients, the real HTTP
server on loopback. All 200 requests are sent at once so the engine decodes them in batches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from freetoken.loader.model_setup import default_model_path
from freetoken.server.settings import ServerConfig
from server_harness import Running, real_engine, serve
from training.default_model import generate

NAME = "freetoken-default"
N = 50  # prompts per held-out set (the figure; do not shrink)
# Measured (2026-11-29): a held-out tool call takes 39-71 completion tokens (thinking + Hermes call
# + <|im_end|>), a no-tool answer 17-72; 128 is evaluate.py's own limit. A reply cut by the limit
# fails the test (a cut no-tool reply could hide a late call).
MAX_TOKENS = 128
WORKERS = 100  # in-flight HTTP requests; the engine below decodes up to 64 at a time

Conv = dict[str, Any]
Call = tuple[str, dict[str, Any]] | None  # (tool name, parsed arguments) of the first call, or None
Answer = tuple[Call, bool]  # (first call, reply cut by max_tokens)


# ---- request shapes -----------------------------------------------------------------------------
def openai_kwargs(conv: Conv) -> dict[str, Any]:
    """The conversation as chat-completions arguments: messages verbatim (a system turn stays a
    message), the tool list as-is (it is already in OpenAI's `{"type": "function", ...}` shape)."""
    kw: dict[str, Any] = {"messages": conv["messages"], "tools": conv["tools"]}
    if conv.get("enable_thinking", True) is False:
        kw["extra_body"] = {"chat_template_kwargs": {"enable_thinking": False}}
    return kw


def anthropic_kwargs(conv: Conv) -> dict[str, Any]:
    """The conversation as Messages arguments: a leading system turn becomes the top-level
    `system`, user/assistant text turns stay, each tool becomes {name, description, input_schema}."""
    msgs = conv["messages"]
    kw: dict[str, Any] = {}
    if msgs and msgs[0]["role"] == "system":
        kw["system"], msgs = msgs[0]["content"], msgs[1:]
    for m in msgs:  # the held-out sets carry only text turns; anything else would need mapping here
        assert m["role"] in ("user", "assistant") and isinstance(m["content"], str), m
    kw["messages"] = [{"role": m["role"], "content": m["content"]} for m in msgs]
    kw["tools"] = [
        {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
        for f in (t["function"] for t in conv["tools"])
    ]
    if conv.get("enable_thinking", True) is False:
        kw["thinking"] = {"type": "disabled"}
    return kw


# ---- one request per API ------------------------------------------------------------------------
def openai_call(client: Any, conv: Conv) -> Answer:
    r = client.chat.completions.create(model=NAME, temperature=0, max_tokens=MAX_TOKENS, **openai_kwargs(conv))
    calls = r.choices[0].message.tool_calls or []
    call = (calls[0].function.name, json.loads(calls[0].function.arguments)) if calls else None
    return call, r.choices[0].finish_reason == "length"


def anthropic_call(client: Any, conv: Conv) -> Answer:
    r = client.messages.create(
        model=NAME, max_tokens=MAX_TOKENS, extra_body={"temperature": 0}, **anthropic_kwargs(conv)
    )
    uses = [b for b in r.content if b.type == "tool_use"]
    return ((uses[0].name, dict(uses[0].input)) if uses else None), r.stop_reason == "max_tokens"


# ---- fixtures: one server, all 200 requests in flight together ----------------------------------
@pytest.fixture(scope="module")
def server():
    engine = real_engine(str(default_model_path()), max_running_requests=64, max_model_len=1024)
    with serve(engine, ServerConfig(served_model_names=(NAME,))) as running:
        yield running


@pytest.fixture(scope="module")
def heldout() -> dict[str, list[Conv]]:
    return {"tool": generate.heldout_tool_prompts(N), "no_tool": generate.heldout_no_tool_prompts(N)}


@pytest.fixture(scope="module")
def answers(server: Running, heldout: dict[str, list[Conv]]) -> dict[tuple[str, str], list[Answer]]:
    """{(api, set): (first call, cut) per prompt, in prompt order}, every request sent concurrently."""
    import anthropic
    import openai

    apis: dict[str, Callable[[Conv], Answer]] = {}
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=300)
    apis["openai"] = lambda c: openai_call(oa, c)
    apis["anthropic"] = lambda c: anthropic_call(an, c)
    jobs = [(api, name, conv) for api in apis for name, convs in heldout.items() for conv in convs]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda j: apis[j[0]](j[2]), jobs))
    print(f"\n[tools] {len(jobs)} requests in {time.perf_counter() - t0:.1f} s")
    out: dict[tuple[str, str], list[Answer]] = {}
    for (api, name, _), answer in zip(jobs, results):
        out.setdefault((api, name), []).append(answer)
    return out


# ---- the thresholds ---------------------------------------------------------------------
def expected(conv: Conv) -> Call:
    return conv["meta"]["name"], conv["meta"]["arguments"]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_heldout_tool_calls_name_and_arguments(api: str, answers, heldout) -> None:
    convs, calls = heldout["tool"], [call for call, _ in answers[(api, "tool")]]
    # the expected name must come from the request's own tool list (drawn per prompt, not hard-wired)
    assert all(c["meta"]["name"] in {t["function"]["name"] for t in c["tools"]} for c in convs)
    hits = [call == expected(c) for c, call in zip(convs, calls)]
    names = sum(call is not None and call[0] == c["meta"]["name"] for c, call in zip(convs, calls))
    acc = sum(hits) / len(hits)
    misses = [(c["messages"][-1]["content"], call) for c, call, ok in zip(convs, calls, hits) if not ok]
    print(f"\n[tools] {api}: name + arguments {sum(hits)}/{len(hits)} ({acc:.0%}), name {names}/{len(hits)}")
    print(f"[tools] {api} misses: {misses}")
    assert acc >= 0.90, f"{api}: tool name + arguments right in {acc:.0%} (< 90%); misses {misses}"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_heldout_no_tool_prompts_rarely_call(api: str, answers, heldout) -> None:
    convs, calls = heldout["no_tool"], [call for call, _ in answers[(api, "no_tool")]]
    cut = [c["messages"][-1]["content"] for c, (_, was_cut) in zip(convs, answers[(api, "no_tool")]) if was_cut]
    assert not cut, f"{api}: replies cut at max_tokens={MAX_TOKENS}, a tool call may be missing: {cut}"
    spurious = [(c["messages"][-1]["content"], call) for c, call in zip(convs, calls) if call is not None]
    rate = len(spurious) / len(convs)
    print(f"\n[tools] {api}: tool-call rate on no-tool prompts {len(spurious)}/{len(convs)} ({rate:.0%})")
    assert rate <= 0.10, f"{api}: tool calls on {rate:.0%} of no-tool prompts (> 10%): {spurious}"
