"""Server-level hardening (issue 17): body limits, a huge request that holds up nobody, auth on every
route but the liveness probe, stats true after aborts, and a graceful shutdown."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from freetoken.server.settings import ServerConfig
from scripted_engine import ScriptedEngine
from server_harness import MODEL, free_port, real_engine, serve, tiny_checkpoint

CHAT, RESP, MSGS, COUNT = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
HI = [{"role": "user", "content": "hi"}]
JSON = {"Content-Type": "application/json"}
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_checkpoint(str(tmp_path_factory.mktemp("hardening_server")))


def _error_kind(r: httpx.Response, path: str) -> str:
    body = r.json()
    if path.startswith(MSGS):
        assert body["type"] == "error", body
        return str(body["error"]["type"])
    return str(body["error"]["type"])


def test_bodies_past_the_limit_are_413_in_each_shape(tokenizer: Any) -> None:
    big = "x" * (LIMIT + 1)
    bodies = {
        CHAT: {"model": MODEL, "messages": [{"role": "user", "content": big}]},
        RESP: {"model": MODEL, "input": big},
        MSGS: {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": big}]},
        COUNT: {"model": MODEL, "messages": [{"role": "user", "content": big}]},
    }
    config = ServerConfig(served_model_names=(MODEL,), max_body_bytes=LIMIT)
    with serve(ScriptedEngine(tokenizer), config) as s, httpx.Client(timeout=30) as c:
        for path, body in bodies.items():
            r = c.post(s.url + path, json=body)  # declared Content-Length: refused before the body is read
            assert r.status_code == 413
            assert _error_kind(r, path) == ("request_too_large" if path.startswith(MSGS) else "invalid_request_error")
            chunks = iter([b'{"model": "tiny", "messages": [{"role": "user", "content": "', big.encode(), b'"}]}'])
            r = c.post(s.url + path, content=chunks, headers=JSON)  # chunked: refused as the body outgrows the limit
            assert r.status_code == 413, r.text
            ok = c.post(s.url + CHAT, json={"model": MODEL, "max_tokens": 2, "messages": HI})
            assert ok.status_code == 200
        text = c.get(s.url + "/metrics").text
        assert 'freetoken_errors_total{kind="too_large"} 8' in text


def test_a_huge_count_tokens_holds_up_no_other_request(tokenizer: Any) -> None:
    """Tokenising a multi-megabyte prompt runs on its own thread without the GIL: a small request
    sent after it is answered first (before: one global lock made it wait for the big one)."""
    huge = "the quick brown fox jumps over the lazy dog " * 80_000  # 3.5 MB, in a context that holds it
    done: list[str] = []
    with serve(ScriptedEngine(tokenizer, max_model_len=2_000_000)) as s:

        def count(name: str, text: str) -> int:
            body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
            r = httpx.post(s.url + COUNT, json=body, timeout=120)
            done.append(name)
            return int(r.json()["input_tokens"])

        with cf.ThreadPoolExecutor(2) as pool:
            big = pool.submit(count, "big", huge)
            time.sleep(0.3)
            small = pool.submit(count, "small", "hello")
            assert small.result() > 0 and big.result() > 700_000
        assert done == ["small", "big"]


def test_api_key_guards_every_route_but_the_liveness_probe(tokenizer: Any) -> None:
    key = {"Authorization": "Bearer s3cret"}
    with serve(ScriptedEngine(tokenizer), ServerConfig(api_key="s3cret", served_model_names=(MODEL,))) as s:
        for path in ("/metrics", "/v1/engine/stats", "/v1/models"):
            assert httpx.get(s.url + path).status_code == 401, path
            assert httpx.get(s.url + path, headers=key).status_code == 200, path
        assert httpx.get(s.url + "/health").json() == {"status": "ok"}
        assert httpx.get(s.url + "/health", headers=key).json() == {"status": "ok", "model": MODEL}
        s.engine.state, s.engine.error = "dead", "CUDA error at /secret/path"
        assert httpx.get(s.url + "/health").json() == {"status": "unhealthy"}
        assert "secret" in httpx.get(s.url + "/health", headers=key).json()["error"]
        s.engine.state = "ready"
    for empty in ("", "  "):
        with pytest.raises(ValueError, match="empty"):
            ServerConfig(api_key=empty)


def test_ft_serve_refuses_an_empty_api_key(capsys: pytest.CaptureFixture[str]) -> None:
    from freetoken.cli.main import main

    assert main(["serve", "--api-key", ""]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ft serve: error: the API key is empty")


def test_stats_are_true_after_an_aborted_stream(tiny: str) -> None:
    with serve(real_engine(tiny, max_model_len=256), ServerConfig(served_model_names=(MODEL,))) as s:
        body = {"model": MODEL, "max_tokens": 200, "ignore_eos": True, "stream": True, "messages": HI}
        with httpx.stream("POST", s.url + CHAT, json=body, timeout=30) as r:
            for line in r.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break  # a token arrived: the request is running; closing the stream aborts it
        deadline = time.time() + 5
        while True:
            engine = httpx.get(s.url + "/v1/engine/stats").json()["engine"]
            if engine["running"] == 0 and engine["kv_pages_used"] == 0 or time.time() > deadline:
                break
            time.sleep(0.05)
        assert engine["running"] == 0 and engine["waiting"] == 0 and engine["kv_pages_used"] == 0, engine
        time.sleep(0.3)
        later = httpx.get(s.url + "/v1/engine/stats").json()["engine"]
        assert later["uptime_s"] >= engine["uptime_s"] + 0.25  # live, not frozen at the last step
        server = httpx.get(s.url + "/v1/engine/stats").json()["server"]
        assert server["requests_running"] == 0


@pytest.fixture
def served() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``ft serve`` as users run it: the embedded model, a real process, a 1 s shutdown timeout."""
    port = free_port()
    cmd = [sys.executable, "-m", "freetoken.cli.main", "serve", "--device", "cpu"]
    cmd += ["--port", str(port), "--served-model-name", MODEL, "--shutdown-timeout", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.time() < deadline, "ft serve did not start"
        time.sleep(0.2)
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_ends_every_request_in_its_shape_and_exits_0(served: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = served
    long = {"max_tokens": 1500, "ignore_eos": True, "temperature": 0.7}

    def stream(path: str, body: dict[str, Any]) -> list[str]:
        with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        return lines

    chat = {"model": MODEL, "messages": HI, **long}
    msgs = {"model": MODEL, "messages": HI, **long}
    resp = {"model": MODEL, "input": "hi", "max_output_tokens": 1500, "ignore_eos": True}
    with cf.ThreadPoolExecutor(4) as pool:
        futures = {
            "chat": pool.submit(stream, CHAT, chat),
            "messages": pool.submit(stream, MSGS, msgs),
            "responses": pool.submit(stream, RESP, resp),
            "plain": pool.submit(lambda: httpx.post(url + CHAT, json=chat, timeout=60)),
        }
        deadline = time.monotonic() + 60  # all four are generating (1,500 tokens take far longer on a CPU)
        while httpx.get(url + "/v1/engine/stats", timeout=10).json()["engine"].get("running", 0) < 4:
            assert time.monotonic() < deadline, "the four requests never ran together"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        got = {name: f.result() for name, f in futures.items()}
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "CancelledError" not in err, err
    assert '"error"' in got["chat"][-2] and "shutting down" in got["chat"][-2] and got["chat"][-1] == "data: [DONE]"
    assert got["messages"][-2] == "event: error" and "shutting down" in got["messages"][-1]
    assert got["responses"][-2] == "event: response.failed" and "shutting down" in got["responses"][-1]
    plain = got["plain"]
    assert plain.status_code == 503 and "shutting down" in plain.json()["error"]["message"]


def test_a_client_leaving_mid_body_is_no_server_error(tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A client that sends half its declared body and closes: nobody is left to answer; nothing is logged as an
    unhandled error, nothing counted as one, and the next request is served."""
    import socket

    config = ServerConfig(served_model_names=(MODEL,))
    with serve(ScriptedEngine(tokenizer), config) as s, caplog.at_level("DEBUG", logger="freetoken.server.guard"):
        host, port = s.url.split("//")[1].split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 1000\r\n\r\n{\"model\": ".encode())  # fmt: skip
        deadline = time.monotonic() + 10
        while "client left" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "client left" in caplog.text
        assert "unhandled error" not in caplog.text
        ok = httpx.post(s.url + CHAT, json={"model": MODEL, "max_tokens": 2, "messages": HI}, timeout=30)
        assert ok.status_code == 200
        assert "freetoken_errors_total{kind=\"server_error\"}" not in httpx.get(s.url + "/metrics").text
