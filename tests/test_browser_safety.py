"""Browser safety over real HTTP on loopback (``server/browser.py``): what a web page could send — ``text/plain``,
form and type-less bodies, a foreign or ``null`` Origin, a DNS-rebinding Host — is refused in the route's API shape
before anything reaches the engine (its counters and the resize calls stay as they were); the server's own origin
and the origins in ``--cors-origins`` (with preflight and CORS headers, streams included) still work. The control
routes' loopback rule is checked at the ASGI level (all test traffic is loopback) and over a real socket on this
machine's non-loopback address where it has one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from freetoken.server.settings import ServerConfig
from scripted_engine import ScriptedEngine
from server_harness import MODEL, Running, serve

CHAT, RESP, MSGS, COUNT, MEMORY = (
    "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/engine/memory"
)  # fmt: skip
HI = [{"role": "user", "content": "hi"}]
BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL, "max_tokens": 2, "messages": HI},
    RESP: {"model": MODEL, "max_output_tokens": 2, "input": "hi"},
    MSGS: {"model": MODEL, "max_tokens": 2, "messages": HI},
    COUNT: {"model": MODEL, "messages": HI},
    MEMORY: {"vram_budget": 1.5, "reason": "a web page"},
}
FRIEND = "http://localhost:5173"


class CountingEngine(ScriptedEngine):
    """The scripted engine, counting generate calls and recording resizes (it has no memory of its own)."""

    def __init__(self, tokenizer: Any, **kw: Any) -> None:
        super().__init__(tokenizer, **kw)
        self.calls = 0
        self.resizes: list[tuple[float, str]] = []

    def generate(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        self.calls += 1
        return super().generate(*args, **kw)

    async def set_vram_budget(self, gib: float, reason: str) -> dict[str, Any]:
        self.resizes.append((gib, reason))
        return {"budget_gib": gib}


def snapshot(srv: Running) -> tuple[Any, ...]:
    """Everything a request that reached a route would move: server and engine counters, the resizes."""
    e = srv.engine
    m = srv.state.metrics
    return (m.requests_total, m.generated_tokens_total, e.calls, tuple(e.resizes), e.finished, e.aborted, e.running)


def refused(r: httpx.Response, path: str, status: int, says: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    if path.startswith(MSGS):
        kind = "permission_error" if status == 403 else "invalid_request_error"
        assert body["type"] == "error" and body["error"]["type"] == kind, body
        message = body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["type"] == ("permission_error" if status == 403 else "invalid_request_error")
        message = body["error"]["message"]
    assert says in message, message


@pytest.fixture(scope="module")
def srv(tokenizer: Any) -> Iterator[Running]:
    with serve(CountingEngine(tokenizer), ServerConfig(served_model_names=(MODEL,), cors_origins=(FRIEND,))) as s:
        yield s


def port(srv: Running) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def test_the_reproducer_is_refused_and_reaches_nothing(srv: Running) -> None:
    """The issue's curl: text/plain, a foreign Origin, a foreign Host; against generation and the resize path."""
    hostile = {"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example", "Host": "evil.example"}
    before = snapshot(srv)
    for path in (CHAT, MEMORY):
        r = httpx.post(srv.url + path, headers=hostile, content=str(BODIES[path]).replace("'", '"').encode())
        refused(r, path, 403, "--allowed-hosts")
    assert snapshot(srv) == before
    # the same body as JSON from a plain client goes through: the counters above can move
    assert httpx.post(srv.url + CHAT, json=BODIES[CHAT]).status_code == 200
    assert httpx.post(srv.url + MEMORY, json=BODIES[MEMORY]).status_code == 200
    after = snapshot(srv)
    assert after[2] == before[2] + 1 and after[3] == (*before[3], (1.5, "a web page"))


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "",
        None,
    ],
)
def test_bodies_not_declared_json_are_415_in_each_shape(srv: Running, content_type: str | None) -> None:
    before = snapshot(srv)
    with httpx.Client(timeout=30) as c:
        for path, body in BODIES.items():
            req = c.build_request("POST", srv.url + path, json=body)
            del req.headers["content-type"]
            if content_type is not None:
                req.headers["content-type"] = content_type
            refused(c.send(req), path, 415, "must be JSON (Content-Type: application/json)")
        assert snapshot(srv) == before
        # the refused bodies were read to their end: the same keep-alive connection answers the next request
        assert c.post(srv.url + CHAT, json=BODIES[CHAT]).status_code == 200
    assert srv.state.metrics.errors_total["unsupported_media_type"] >= len(BODIES)


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON;charset=UTF-8", "application/vnd.api+json"])  # fmt: skip
def test_json_content_types_are_accepted(srv: Running, content_type: str) -> None:
    calls = srv.engine.calls
    for path, body in BODIES.items():
        r = httpx.post(srv.url + path, json=body, headers={"Content-Type": content_type})
        assert r.status_code == 200, (path, r.text)
    assert srv.engine.calls == calls + 3  # chat, responses, messages


def test_foreign_origins_are_refused(srv: Running) -> None:
    p = port(srv)
    foreign = ["http://evil.example", "null", f"http://127.0.0.1:{p + 1}", f"http://localhost:{p}",
               f"https://127.0.0.1:{p}", "http://localhost:5174", "http://127.0.0.1"]  # fmt: skip
    before = snapshot(srv)
    for origin in foreign:
        for path, body in BODIES.items():
            r = httpx.post(srv.url + path, json=body, headers={"Origin": origin})
            refused(r, path, 403, "--cors-origins")
            assert "access-control-allow-origin" not in r.headers
        refused(httpx.get(srv.url + "/v1/models", headers={"Origin": origin}), "/v1/models", 403, "--cors-origins")
        preflight = {"Origin": origin, "Access-Control-Request-Method": "POST"}
        r = httpx.options(srv.url + CHAT, headers=preflight)
        refused(r, CHAT, 403, "--cors-origins")
        assert "access-control-allow-origin" not in r.headers
    assert snapshot(srv) == before


def test_own_origin_is_allowed(srv: Running) -> None:
    """The chat page's fetches: Origin is the server's own scheme://host:port, under any Host the check allows."""
    p = port(srv)
    calls = srv.engine.calls
    for host in (f"127.0.0.1:{p}", f"localhost:{p}", f"[::1]:{p}", f"LocalHost:{p}"):
        headers = {"Host": host, "Origin": f"http://{host.lower()}"}
        r = httpx.post(srv.url + CHAT, json=BODIES[CHAT], headers=headers)
        assert r.status_code == 200, (host, r.text)
        assert "access-control-allow-origin" not in r.headers  # same-origin: no CORS needed
    assert srv.engine.calls == calls + 4
    # an own origin under another Host is another origin
    refused(httpx.post(srv.url + CHAT, json=BODIES[CHAT], headers={"Origin": f"http://localhost:{p}"}), CHAT, 403,
            "--cors-origins")  # fmt: skip


def test_rebinding_hosts_are_refused(srv: Running) -> None:
    p = port(srv)
    bad = ["evil.example", f"evil.example:{p}", f"127.0.0.1:{p + 1}", "127.0.0.1", "localhost", f"localhost.evil:{p}",
           f"127.0.0.1.nip.io:{p}", f"192.0.2.77:{p}", "", f"127.0.0.1:{p}:1", "[::1", f"[::1]x:{p}"]  # fmt: skip
    before = snapshot(srv)
    for host in bad:
        for path, body in BODIES.items():
            refused(httpx.post(srv.url + path, json=body, headers={"Host": host}), path, 403, "--allowed-hosts")
        for page in ("/", "/chat/chat.js", "/health", "/v1/models", "/v1/engine/stats"):
            r = httpx.get(srv.url + page, headers={"Host": host})
            assert r.status_code == 403 and "--allowed-hosts" in r.text, (host, page)
    assert snapshot(srv) == before
    for host in (f"127.0.0.1:{p}", f"localhost:{p}", f"[::1]:{p}", f"[0:0::1]:{p}"):
        assert httpx.get(srv.url + "/v1/models", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts(tokenizer: Any) -> None:
    config = ServerConfig(served_model_names=(MODEL,), allowed_hosts=("My-Box.lan", "proxy.example:8443"))
    with serve(CountingEngine(tokenizer), config) as s:
        p = port(s)
        for host in ("my-box.lan", f"my-box.lan:{p}", "MY-BOX.LAN:1", "proxy.example:8443"):
            assert httpx.get(s.url + "/v1/models", headers={"Host": host}).status_code == 200, host
            # the page it serves under that name is its own origin
            own = {"Host": host, "Origin": f"http://{host.lower()}"}
            assert httpx.post(s.url + CHAT, json=BODIES[CHAT], headers=own).status_code == 200, host
        for host in ("proxy.example", "proxy.example:443", "other.lan", f"box.lan:{p}"):
            assert httpx.get(s.url + "/v1/models", headers={"Host": host}).status_code == 403, host
    with serve(CountingEngine(tokenizer), ServerConfig(served_model_names=(MODEL,), allowed_hosts=("*",))) as s:
        assert httpx.get(s.url + "/v1/models", headers={"Host": "anything.example:9"}).status_code == 200
        r = httpx.post(s.url + CHAT, json=BODIES[CHAT], headers={"Origin": "http://evil.example"})
        refused(r, CHAT, 403, "--cors-origins")  # '*' opens the Host check, not the Origin check


def test_listed_origin_gets_preflight_and_cors_headers(srv: Running) -> None:
    asked = "authorization, content-type, x-api-key, anthropic-version, x-stainless-os, x-stainless-retry-count, " \
            "anthropic-dangerous-direct-browser-access, x-evil"  # fmt: skip
    r = httpx.options(srv.url + MSGS, headers={"Origin": FRIEND, "Access-Control-Request-Method": "POST",
                                               "Access-Control-Request-Headers": asked})  # fmt: skip
    assert r.status_code == 204 and r.content == b""
    assert r.headers["access-control-allow-origin"] == FRIEND
    assert {"GET", "POST"} <= {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
    allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
    assert allowed == {h.strip() for h in asked.split(",")} - {"x-evil"}
    assert "Origin" in r.headers["vary"] and int(r.headers["access-control-max-age"]) > 0

    calls = srv.engine.calls
    r = httpx.post(srv.url + CHAT, json=BODIES[CHAT], headers={"Origin": FRIEND})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == FRIEND
    assert "Origin" in r.headers.get_list("vary")
    assert r.json()["choices"][0]["message"]["content"]
    body = {**BODIES[MSGS], "stream": True}
    with httpx.stream("POST", srv.url + MSGS, json=body, headers={"Origin": FRIEND}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["access-control-allow-origin"] == FRIEND
        assert "event: message_stop" in r.read().decode()
    assert srv.engine.calls == calls + 2
    # its errors carry the header too, so the page can read them
    r = httpx.post(srv.url + CHAT, content=b"{}", headers={"Origin": FRIEND, "Content-Type": "text/plain"})
    refused(r, CHAT, 415, "must be JSON")
    assert r.headers["access-control-allow-origin"] == FRIEND
    r = httpx.post(srv.url + CHAT, json={"model": MODEL}, headers={"Origin": FRIEND})
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == FRIEND
