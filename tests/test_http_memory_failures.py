"""``POST /v1/engine/memory`` and ``/health`` on the real server (loopback, the real engine on the CPU) when a budget
is more than the machine has, or the machine refuses the memory mid-resize (2026-12-05): a budget over what exists
is a 400 naming both, before anything is freed; an allocation failing after teardown has begun is a 503 and the
engine is as it was (sizes, tokens, ``/health`` ok, integrity); an engine that cannot generate makes ``/health``
answer 503 until it can again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from server_harness import MEMORY_AUTH, MODEL, Running, engine_memory, resizable_server
from test_elastic_rollback import ALLOC, FailingAllocator, Guard

AUTH = MEMORY_AUTH


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with resizable_server(str(tmp_path_factory.mktemp("tiny"))) as s:
        yield s


_memory = engine_memory


def _answer(srv: Running) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 plus 3?"}], "max_tokens": 24,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def _health(srv: Running) -> httpx.Response:
    return httpx.get(srv.url + "/health", headers=AUTH)


def _sizes(m: dict[str, Any]) -> tuple[int, int, float]:
    return m["slots"], m["kv_pages"], m["budget_gib"]


def test_budgets_over_what_the_machine_has_are_400s_before_anything_is_freed(
    srv: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    want, before = _answer(srv), _memory(srv)
    guard = Guard().install(monkeypatch)
    ram = psutil.virtual_memory().total / 2**30
    for gib in (2 * ram, 1000, 1e308):
        r = httpx.post(srv.url + "/v1/engine/memory", json={"vram_budget": gib}, headers=AUTH)
        assert r.status_code == 400, (gib, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == "vram_budget"
        msg = err["message"]
        assert f"a VRAM budget of {gib:.3f} GiB exceeds what this machine has for the caches: host RAM" in msg
        assert "GiB free +" in msg and "GiB in all" in msg, msg
    assert guard.asked == []  # refused before any cache was touched
    assert _sizes(_memory(srv)) == _sizes(before)
    assert _health(srv).json()["status"] == "ok"
    assert _answer(srv) == want
    srv.engine.check_integrity()


@pytest.mark.parametrize("fail_at", [1, 3, 5])
def test_an_allocation_failing_mid_resize_is_a_503_and_the_engine_is_as_it_was(
    srv: Running, fail_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    want, before = _answer(srv), _memory(srv)
    slot, page = before["slots_gib"] / before["slots"], before["kv_gib"] / before["kv_pages"]
    gib = before["budget_gib"] + 16 * page + 1e-9  # 16 KV pages more: the KV pool is re-made (after teardown)
    FailingAllocator({fail_at: ALLOC}).install(monkeypatch)
    r = httpx.post(srv.url + "/v1/engine/memory", json={"vram_budget": gib}, headers=AUTH)
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "resize_failed" and err["param"] == "vram_budget"
    assert f"the resize to {gib:.3f} GiB" in err["message"] and "can't allocate memory" in err["message"]
    assert "What exists: host RAM" in err["message"]
    assert f"The engine is at {before['slots']} expert slots + {before['kv_pages']} KV pages" in err["message"]
    assert slot > 0 and _sizes(_memory(srv)) == _sizes(before)
    h = _health(srv)
    assert h.status_code == 200 and h.json()["status"] == "ok"
    assert _answer(srv) == want
    srv.engine.check_integrity()


def test_health_is_503_while_the_engine_cannot_generate(srv: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every allocation fails from the first: the resize cannot put the KV pool back either; its used pages wait in
    host memory and no step can run: ``/health`` says so (503, and why), until the allocator heals."""
    import time

    want, before = _answer(srv), _memory(srv)
    page = before["kv_gib"] / before["kv_pages"]
    alloc = FailingAllocator({}, every_from=1).install(monkeypatch)
    r = httpx.post(srv.url + "/v1/engine/memory", json={"vram_budget": before["budget_gib"] + 16 * page + 1e-9},
                   headers=AUTH)  # fmt: skip
    assert r.status_code == 503 and "The engine waits for device memory" in r.json()["error"]["message"]
    h = _health(srv)
    assert h.status_code == 503 and h.json()["status"] == "unhealthy"
    assert "waits for device memory" in h.json()["error"]
    assert httpx.get(srv.url + "/health").json() == {"status": "unhealthy"}  # no key: no detail
    alloc.every_from = None  # the memory is there again: the idle engine asks again (RESUME_S) and gets it back
    deadline = time.monotonic() + 30
    while _health(srv).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _health(srv).json()["status"] == "ok"
    assert _answer(srv) == want
    assert _sizes(_memory(srv))[:2] == _sizes(before)[:2]  # the split before the failure, asked for again
    srv.engine.check_integrity()


def test_health_is_503_when_the_engine_thread_is_gone(srv: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _health(srv).status_code == 200
    monkeypatch.setattr(srv.engine._thread, "is_alive", lambda: False)
    h = _health(srv)
    assert h.status_code == 503 and h.json()["error"] == "the engine thread is gone"
