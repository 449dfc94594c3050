"""Browser safety, the rest: the control routes (``/v1/engine/*``) answer only loopback clients while no API key is
set — at the ASGI level with the scope's ``client`` set to other addresses (all test traffic is loopback), and over
a real socket on this machine's non-loopback address where it has one; a refused body past the limit is not read on;
the settings and ``ft serve`` flags; the one-line warning for a server exposed without a key; the issue's reproducer
against the real engine (its statistics unchanged)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from freetoken.cli.main import build_parser
from freetoken.cli.serve import configs
from freetoken.server.app import build_app
from freetoken.server.browser import BrowserSafety, exposure_warning
from freetoken.server.settings import ServerConfig
from server_harness import MODEL, free_port, real_engine, serve, tiny_checkpoint
from subproc import child_env
from test_browser_safety import BODIES, CHAT, MEMORY, CountingEngine, refused

KEY = "k3y"


async def _asgi(app: Any, client: str, method: str, path: str, **kw: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=(client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1919") as c:
        return await c.request(method, path, **kw)


def call(app: Any, client: str, method: str, path: str, **kw: Any) -> httpx.Response:
    return asyncio.run(_asgi(app, client, method, path, **kw))


@pytest.mark.parametrize("client", ["192.0.2.50", "10.0.0.1", "fd00::2", "::ffff:192.0.2.50", "not-an-address"])
def test_control_routes_refuse_other_clients_without_a_key(tokenizer: Any, client: str) -> None:
    engine = CountingEngine(tokenizer)
    app = build_app(engine, ServerConfig(served_model_names=(MODEL,)), own_engine=False)
    r = call(app, client, "GET", "/v1/engine/stats")
    refused(r, "/v1/engine/stats", 403, "loopback clients only while the server has no API key (ft serve --api-key)")
    assert r.json()["error"]["code"] == "loopback_only"
    refused(call(app, client, "POST", MEMORY, json=BODIES[MEMORY]), MEMORY, 403, "--api-key")
    assert engine.resizes == []
    assert call(app, client, "GET", "/v1/models").status_code == 200  # the API itself is not a control route
    assert call(app, client, "POST", CHAT, json=BODIES[CHAT]).status_code == 200


@pytest.mark.parametrize("client", ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"])
def test_control_routes_answer_loopback_clients(tokenizer: Any, client: str) -> None:
    engine = CountingEngine(tokenizer)
    app = build_app(engine, ServerConfig(served_model_names=(MODEL,)), own_engine=False)
    assert call(app, client, "GET", "/v1/engine/stats").json()["state"] == "ready"
    assert call(app, client, "POST", MEMORY, json=BODIES[MEMORY]).status_code == 200
    assert engine.resizes == [(1.5, "a web page")]


def test_with_a_key_control_routes_answer_its_holders_anywhere(tokenizer: Any) -> None:
    engine = CountingEngine(tokenizer)
    app = build_app(engine, ServerConfig(served_model_names=(MODEL,), api_key=KEY), own_engine=False)
    assert call(app, "192.0.2.50", "GET", "/v1/engine/stats").status_code == 401
    assert call(app, "192.0.2.50", "POST", MEMORY, json=BODIES[MEMORY]).status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    assert call(app, "192.0.2.50", "GET", "/v1/engine/stats", headers=auth).status_code == 200
    assert call(app, "192.0.2.50", "POST", MEMORY, json=BODIES[MEMORY], headers={"x-api-key": KEY}).status_code == 200
    assert engine.resizes == [(1.5, "a web page")]


def non_loopback_address() -> str | None:
    import socket

    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


@contextmanager
def serve_on(host: str, engine: Any) -> Iterator[str]:
    import uvicorn

    port = free_port()
    app = build_app(engine, ServerConfig(host=host, port=port, served_model_names=(MODEL,)), own_engine=False)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def test_control_routes_over_a_real_non_loopback_socket(tokenizer: Any) -> None:
    """Bound to this machine's own network address and called through it: the client address is not loopback."""
    addr = non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    engine = CountingEngine(tokenizer)
    with serve_on(addr, engine) as url:
        assert httpx.get(url + "/v1/models").status_code == 200  # Host: the address it listens on
        refused(httpx.get(url + "/v1/engine/stats"), "/v1/engine/stats", 403, "--api-key")
        refused(httpx.post(url + MEMORY, json=BODIES[MEMORY]), MEMORY, 403, "--api-key")
        assert engine.resizes == []
        refused(httpx.get(url + "/v1/models", headers={"Host": "evil.example"}), "/v1/models", 403, "--allowed-hosts")


def test_a_refused_body_past_the_limit_is_not_read_on(tokenizer: Any) -> None:
    """Read and dropped up to the body limit (the client sees the answer); past it the connection closes."""
    state = build_app(CountingEngine(tokenizer), ServerConfig(max_body_bytes=4096)).state.freetoken
    layer = BrowserSafety(lambda *a: None, state)  # type: ignore[arg-type, return-value]
    chunks = [{"type": "http.request", "body": b"x" * 3000, "more_body": True}] * 10
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return chunks.pop()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"host", b"127.0.0.1:1919"), (b"content-type", b"text/plain")]
    scope = {"type": "http", "method": "POST", "path": CHAT, "scheme": "http", "server": ("127.0.0.1", 1919),
             "client": ("127.0.0.1", 5), "headers": headers}  # fmt: skip
    asyncio.run(layer(scope, receive, send))  # type: ignore[arg-type]
    assert len(chunks) == 8  # two chunks read (6000 bytes > 4096), the rest left
    assert sent[0]["status"] == 415 and (b"connection", b"close") in sent[0]["headers"]


def test_settings_normalise_and_refuse() -> None:
    origins = ("HTTP://LocalHost:80/", "https://app.example:443", "http://x:3000", "null", "*")
    cfg = ServerConfig(allowed_hosts=(" My-Box.LAN ", "[0:0::1]:8080", "*"), cors_origins=origins)
    assert cfg.allowed_hosts == ("my-box.lan", "[0:0::1]:8080", "*")
    assert cfg.cors_origins == ("http://localhost", "https://app.example", "http://x:3000", "null", "*")
    for bad in ("http://x/path", "localhost:3000", "http://x:99999", "http://user@x", "http://x?q=1", "x"):
        with pytest.raises(ValueError, match="cors origin"):
            ServerConfig(cors_origins=(bad,))
    for bad in ("a:b", "[::1", "h:0"):
        with pytest.raises(ValueError, match="allowed host"):
            ServerConfig(allowed_hosts=(bad,))


def test_serve_flags() -> None:
    args = build_parser().parse_args(["serve", "--allowed-hosts", "a.example, b.example:8080,",
                                      "--cors-origins", "http://localhost:5173,null"])  # fmt: skip
    _, cfg = configs(args)
    assert cfg.allowed_hosts == ("a.example", "b.example:8080") and cfg.cors_origins == (
        "http://localhost:5173",
        "null",
    )
    _, cfg = configs(build_parser().parse_args(["serve"]))
    assert cfg.allowed_hosts == () and cfg.cors_origins == ()
    assert "--cors-origins" in build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]


def test_exposure_warning() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.1.1"):
        assert exposure_warning(host, 1919, None) is None
    for host in ("0.0.0.0", "::", "192.0.2.2"):
        assert exposure_warning(host, 1919, "k") is None
        line = exposure_warning(host, 1919, None)
        assert line is not None and "\n" not in line and f"{host}:1919" in line and "--api-key" in line


def test_ft_serve_prints_the_warning_before_loading() -> None:
    env = child_env()
    cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--host", "0.0.0.0", "--port", str(free_port()),
           "--model", "/nonexistent", "--device", "cpu"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 2, r.stderr
    assert lines[0].startswith("warning: listening on 0.0.0.0:") and "without --api-key" in lines[0]
    assert lines[1].startswith("ft serve: error: cannot load /nonexistent")


def test_the_reproducer_against_the_real_engine(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The issue's curl against the real engine on the CPU: generation and the resize path refused, the engine's
    own statistics (prefill, decode, expert traffic, memory split) as they were."""
    model = tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")))
    engine = real_engine(model, max_model_len=128, vram_budget=0.004, vram_reserve=0.0)
    with serve(engine) as s:
        p = int(s.url.rsplit(":", 1)[1])
        hostile = {"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example"}
        before, stats = snapshot_real(s), engine_stats(s)
        assert {"prefill_tokens", "expert_hits", "expert_fills", "memory"} <= set(stats), stats
        for host in ("evil.example", f"127.0.0.1:{p}"):  # a rebinding name; the right Host, still a foreign page
            for path in (CHAT, MEMORY):
                r = httpx.post(s.url + path, headers={**hostile, "Host": host}, content=_json(BODIES[path]))
                assert r.status_code == 403, r.text
        for path in (CHAT, MEMORY):  # no Origin (curl, a script): still not JSON
            r = httpx.post(s.url + path, headers={"Content-Type": "text/plain"}, content=_json(BODIES[path]))
            assert r.status_code == 415, r.text
        assert snapshot_real(s) == before and engine_stats(s) == stats
        assert httpx.post(s.url + CHAT, json=BODIES[CHAT]).status_code == 200  # and the engine does move
        assert s.engine.stats()["prefill_tokens"] > stats["prefill_tokens"]


def engine_stats(s: Any) -> dict[str, Any]:
    return {k: v for k, v in s.engine.stats().items() if k != "uptime_s"}


def snapshot_real(s: Any) -> tuple[int, int]:
    return s.state.metrics.requests_total, s.state.metrics.generated_tokens_total


def _json(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()
