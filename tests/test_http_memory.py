"""``POST /v1/engine/memory`` on the real server (loopback, the real engine on the CPU): resizes while
requests stream lose none of them and change none of their tokens; ``/v1/engine/stats`` shows the live
split and the last resize; bad budgets are 400s in OpenAI's error shape with the numbers; the route wants
the API key; ``ft ctl memory`` drives it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from freetoken.cli.main import main as ft_main
from server_harness import MEMORY_AUTH, MEMORY_KEY, MODEL, Running, engine_memory, resizable_server

AUTH = MEMORY_AUTH
N_TOKENS = 96
PROMPTS = [f"Question {i}: what is {i} plus {i * 3}?" for i in range(6)]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with resizable_server(str(tmp_path_factory.mktemp("tiny"))) as s:
        yield s


_memory = engine_memory


def _budget_gib(m: dict[str, Any], slots: int, pages: int) -> float:
    slot = m["slots_gib"] / m["slots"]
    page = m["kv_gib"] / m["kv_pages"]
    return slots * slot + pages * page + m["reserve_gib"] + 1e-9


async def _stream(c: httpx.AsyncClient, url: str, prompt: str) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": N_TOKENS,
            "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip
    text = []
    async with c.stream("POST", url + "/v1/chat/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                import json

                for ch in json.loads(line[6:])["choices"]:
                    d = ch["delta"]
                    text.append((d.get("content") or "") + (d.get("reasoning_content") or ""))
    return "".join(text)


def test_resizes_while_requests_stream_lose_nothing(srv: Running) -> None:
    m0 = _memory(srv)
    assert m0["slots"] > 4 and m0["kv_pages"] > 64
    small = _budget_gib(m0, 2, 34)  # the fewest slots, and about what four running requests need in KV pages
    back = m0["budget_gib"]

    async def solo() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as c:
            return [await _stream(c, srv.url, p) for p in PROMPTS]

    async def together() -> tuple[list[str], list[dict[str, Any]]]:
        async with httpx.AsyncClient(timeout=120) as c:
            jobs = [asyncio.ensure_future(_stream(c, srv.url, p)) for p in PROMPTS]
            answers = []
            for gib in (small, back, small, back):
                await asyncio.sleep(0.1)
                r = await c.post(srv.url + "/v1/engine/memory", json={"vram_budget": gib, "reason": "test"},
                                 headers=AUTH)  # fmt: skip
                assert r.status_code == 200, r.text
                answers.append(r.json()["memory"])
                running.append(srv.state.metrics.requests_running)
            return list(await asyncio.gather(*jobs)), answers

    want = asyncio.run(solo())
    running: list[int] = []
    got, answers = asyncio.run(together())
    assert got == want
    assert all(running[:3]), running  # the resizes landed while requests were streaming
    assert [(a["slots"], a["kv_pages"]) for a in answers] == [(2, 34), (m0["slots"], m0["kv_pages"])] * 2
    last = _memory(srv)["last_resize"]
    assert last["source"] == "api" and last["reason"] == "test" and last["slots_after"] == m0["slots"]
    srv.engine.check_integrity()


def test_bad_budgets_are_refused_in_openai_shape_with_the_numbers(srv: Running) -> None:
    before = _memory(srv)
    r = httpx.post(srv.url + "/v1/engine/memory", json={"vram_budget": 1e-6}, headers=AUTH)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert "below the minimum this model needs" in err["message"] and "expert slots x" in err["message"]
    assert "KV pages x" in err["message"] and "one 256-token context" in err["message"]
    for body in ({"vram_budget": -1}, {"vram_budget": "big"}, {}, {"vram_budget": 1, "extra": 2}):
        r = httpx.post(srv.url + "/v1/engine/memory", json=body, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", body
    json_type = {**AUTH, "Content-Type": "application/json"}
    r = httpx.post(srv.url + "/v1/engine/memory", content=b'{"vram_budget": NaN}', headers=json_type)
    assert r.status_code == 400
    assert httpx.post(srv.url + "/v1/engine/memory", json={"vram_budget": 1}).status_code == 401
    after = _memory(srv)
    assert (after["slots"], after["kv_pages"], after["budget_gib"]) == (
        before["slots"], before["kv_pages"], before["budget_gib"]
    )  # fmt: skip


def test_ft_ctl_memory(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    m = _memory(srv)
    assert ft_main(["ctl", "memory", "--server", srv.url, "--api-key", MEMORY_KEY]) == 0
    assert '"slots"' in capsys.readouterr().out
    gib = _budget_gib(m, 5, m["kv_pages"])
    assert ft_main(["ctl", "memory", "--server", srv.url, "--api-key", MEMORY_KEY, "--vram-budget", str(gib)]) == 0
    assert _memory(srv)["slots"] == 5
    assert ft_main(["ctl", "memory", "--server", srv.url, "--api-key", MEMORY_KEY, "--vram-budget", "1e-7"]) == 1
    assert "below the minimum" in capsys.readouterr().out
    back = str(m["budget_gib"])
    assert ft_main(["ctl", "memory", "--server", srv.url, "--api-key", MEMORY_KEY, "--vram-budget", back]) == 0
    assert _memory(srv)["slots"] == m["slots"]


def test_get_returns_the_memory_plan_as_the_last_resize_left_it(srv: Running) -> None:
    assert httpx.get(srv.url + "/v1/engine/memory").status_code == 401  # the control routes' key
    m = _memory(srv)
    r = httpx.get(srv.url + "/v1/engine/memory", headers=AUTH)
    assert r.status_code == 200
    p = r.json()["plan"]
    assert (p["slots"], p["kv_pages"]) == (m["slots"], m["kv_pages"])
    shares = {s["share"]: s for s in p["shares"]}
    slot, page = p["sizes"]["slot_bytes"], p["sizes"]["page_bytes"]
    assert shares["expert slots"]["bytes"] == (m["slots"] + 1) * slot  # and the scratch slot
    assert shares["KV pages"]["bytes"] == m["kv_pages"] * page
    assert p["budget_bytes"] == round(m["budget_gib"] * 2**30)
    assert p["held_bytes"] == sum(s["bytes"] for s in p["shares"] if "kept free" not in s["share"]
                                  and "host RAM" not in s["share"])  # fmt: skip
    gib = _budget_gib(m, 3, m["kv_pages"])
    assert httpx.post(srv.url + "/v1/engine/memory", json={"vram_budget": gib}, headers=AUTH).status_code == 200
    now = httpx.get(srv.url + "/v1/engine/memory", headers=AUTH).json()["plan"]
    assert (now["slots"], now["kv_pages"]) == (3, m["kv_pages"])
    assert httpx.post(srv.url + "/v1/engine/memory", json={"vram_budget": m["budget_gib"]},
                      headers=AUTH).status_code == 200  # fmt: skip
