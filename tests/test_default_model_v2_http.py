"""v2's held-out evaluation through the SDKs (training/default_model_v2/evaluate_http.py): a held-out conversation
sent through the official `openai` and `anthropic` clients to the real server reaches the engine as exactly the
prompt evaluate.py renders and scores, token for token (tools in the server's key order when the catalogue was
drawn with sorted keys). On an untrained toy v2 checkpoint (random weights, v1's tokenizer and template), short
prompts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from training.default_model_v2 import evaluate, evaluate_http, untrained

LO, HI = 700, 2500  # prompt tokens: evaluate.py's drawing with short bounds (its defaults are 8-40k)


@pytest.fixture(scope="module")
def mods() -> dict[str, ModuleType]:
    return {"evaluate": evaluate, "evaluate_http": evaluate_http, "untrained": untrained}


@pytest.fixture(scope="module")
def model(mods: dict[str, ModuleType], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mods["untrained"].save_untrained(tmp_path_factory.mktemp("v2toy"), toy=True)


@pytest.fixture(scope="module")
def tok(model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


@pytest.fixture(scope="module")
def server(mods: dict[str, ModuleType], model: Path) -> Iterator[tuple[str, Any]]:
    with mods["evaluate_http"].local_server(model, "cpu", 2) as (url, made):
        yield url, made[0]


@pytest.fixture(scope="module")
def convs(mods: dict[str, ModuleType], tok: Any) -> list[tuple[Any, str]]:
    """From evaluate.py's own held-out sets (its seeds): two tool prompts, one arithmetic, two no-tool (missing
    tool, chat), one of them with a history of calls and results, plus the first tool prompt whose catalogue
    was drawn with sorted keys."""
    ev, http = mods["evaluate"], mods["evaluate_http"]
    render, count = ev.renderer(tok)
    sets = {t: ev.heldout_set(t, n, ev.SEEDS[t], render, count, LO, HI) for t, n in (("tool", 24), ("arith", 1),
                                                                                       ("none", 2))}
    picked = sets["tool"][:2] + sets["arith"] + sets["none"]
    picked.append(next(p for p in sets["tool"] if render(http.server_shaped(p[0])) != p[1]))
    if not any(m["role"] == "tool" for c, _ in picked for m in c["messages"]):
        picked.append(next(p for p in sets["tool"] if any(m["role"] == "tool" for m in p[0]["messages"])))
    return picked


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_server_prompt_equals_evaluate_py_token_for_token(api: str, mods: dict[str, ModuleType], tok: Any,
                                                          server: tuple[str, Any], convs: list[Any]) -> None:
    http = mods["evaluate_http"]
    render = mods["evaluate"].renderer(tok)[0]
    url, recorder = server
    oa, an = http.sdk_clients(url, 120)
    send = http.openai_reply if api == "openai" else http.anthropic_reply
    reordered = 0
    for conv, text in convs:
        n_before = len(recorder.prompts)
        reply, prompt_tokens = send(oa if api == "openai" else an, http.MODEL_ALIAS, conv, 1)
        (got,) = recorder.prompts[n_before:]  # one request at a time: this one's prompt
        server_order = render(http.server_shaped(conv))
        reordered += server_order != text  # a sorted-key catalogue: the one difference expected
        want = tok(server_order, add_special_tokens=False)["input_ids"]
        assert list(got) == want, f"{api}: the server's prompt differs from evaluate.py's ({conv['meta']})"
        assert prompt_tokens == len(want)
        assert not reply.called and isinstance(reply.answer, str)
    assert 1 <= reordered < len(convs)


def test_requests_carry_calls_and_results_in_each_apis_shape(mods: dict[str, ModuleType],
                                                             convs: list[Any]) -> None:
    http = mods["evaluate_http"]
    conv = next(c for c, _ in convs if any(m["role"] == "tool" for m in c["messages"]))
    oa = http.openai_kwargs(conv)
    calls = [tc for m in oa["messages"] if m["role"] == "assistant" for tc in m.get("tool_calls") or []]
    results = [m["tool_call_id"] for m in oa["messages"] if m["role"] == "tool"]
    assert calls and results == [tc["id"] for tc in calls][:len(results)]
    assert all(isinstance(tc["function"]["arguments"], str) for tc in calls)
    an = http.anthropic_kwargs(conv)
    assert an["system"] == conv["messages"][0]["content"]
    assert [m["role"] for m in an["messages"]] == ["user", "assistant"] * (len(an["messages"]) // 2) + ["user"]
    uses = [b["id"] for m in an["messages"] if m["role"] == "assistant" and isinstance(m["content"], list)
            for b in m["content"] if b["type"] == "tool_use"]
    answered = [b["tool_use_id"] for m in an["messages"] if m["role"] == "user" and isinstance(m["content"], list)
                for b in m["content"] if b["type"] == "tool_result"]
    assert uses and answered == uses[:len(answered)]
    assert {t["name"] for t in an["tools"]} == {t["function"]["name"] for t in conv["tools"]}
