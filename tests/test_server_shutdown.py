"""``ft serve``'s shutdown edges: a second signal ends every request at once in its API's shape and says so in
the exit status; a FREETOKEN_CACHE FreeToken cannot use is refused in one line."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_harness import MODEL, free_port
from subproc import child_env

CHAT, RESP, MSGS = "/v1/chat/completions", "/v1/responses", "/v1/messages"
HI = [{"role": "user", "content": "hi"}]
LONG = {"model": MODEL, "messages": HI, "max_tokens": 1500, "ignore_eos": True}


def _start(*extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "freetoken.cli.main", "serve", "--device", "cpu", "--port", str(port)]
    cmd += ["--served-model-name", MODEL, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url, deadline = f"http://127.0.0.1:{port}", time.time() + 120
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert time.time() < deadline, "ft serve did not start"
        time.sleep(0.2)


def _stream(url: str, path: str, body: dict[str, Any]) -> list[str] | httpx.Response:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=90) as r:
        if r.status_code != 200:
            r.read()
            return r
        return [line for line in r.iter_lines() if line]


def _wait(url: str, key: str, n: int) -> None:
    deadline = time.monotonic() + 60
    while httpx.get(url + "/v1/engine/stats", timeout=10).json()["engine"].get(key, 0) < n:
        assert time.monotonic() < deadline, f"never {n} {key}"
        time.sleep(0.05)


def test_a_second_ctrl_c_ends_every_request_in_its_shape_and_exits_130() -> None:
    """Before: the second Ctrl-C cut the streams without a final event, answered queued requests with
    plain-text 500s, and exited 0."""
    proc, url = _start("--shutdown-timeout", "600", "--max-running-requests", "3")
    try:
        resp = {"model": MODEL, "input": "hi", "max_output_tokens": 1500, "ignore_eos": True}
        with cf.ThreadPoolExecutor(8) as pool:
            f = {"chat": pool.submit(_stream, url, CHAT, LONG), "messages": pool.submit(_stream, url, MSGS, LONG),
                 "responses": pool.submit(_stream, url, RESP, resp)}  # fmt: skip
            _wait(url, "running", 3)
            f["q_chat"] = pool.submit(lambda: httpx.post(url + CHAT, json=LONG, timeout=90))
            f["q_msgs"] = pool.submit(lambda: httpx.post(url + MSGS, json=LONG, timeout=90))
            f["q_chat_stream"] = pool.submit(_stream, url, CHAT, LONG)
            f["q_msgs_stream"] = pool.submit(_stream, url, MSGS, LONG)
            _wait(url, "waiting", 4)
            proc.send_signal(signal.SIGINT)
            time.sleep(1.0)  # draining: the 600 s timeout would keep every request waiting
            proc.send_signal(signal.SIGINT)
            got = {name: fut.result() for name, fut in f.items()}
        _, err = proc.communicate(timeout=60)  # long before the 600 s drain
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "CancelledError" not in err, err
    chat, msgs, responses = got["chat"], got["messages"], got["responses"]
    assert isinstance(chat, list) and isinstance(msgs, list) and isinstance(responses, list)
    assert '"error"' in chat[-2] and "shutting down" in chat[-2] and chat[-1] == "data: [DONE]"
    assert msgs[-2] == "event: error" and "shutting down" in msgs[-1]
    assert responses[-2] == "event: response.failed" and "shutting down" in responses[-1]
    for name in ("q_chat", "q_chat_stream", "q_msgs", "q_msgs_stream"):
        r = got[name]
        assert isinstance(r, httpx.Response) and r.status_code == 503, (name, r)
        assert r.headers["content-type"] == "application/json", (name, r.text)
        body = r.json()
        if "msgs" in name:
            assert body["type"] == "error" and "shutting down" in body["error"]["message"], body
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}
            assert "shutting down" in body["error"]["message"], body


@pytest.mark.parametrize("value", ["", "relative/cache", " "])
def test_a_cache_dir_freetoken_cannot_use_is_refused_in_one_line(value: str, tmp_path: Path) -> None:
    """Before: an empty FREETOKEN_CACHE built kernels into ./kernels of the working directory."""
    env = child_env(FREETOKEN_CACHE=value)
    cmd = [sys.executable, "-m", "freetoken.cli.main", "generate", "--prompt", "hi", "--max-tokens", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 1, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ft: error: FREETOKEN_CACHE must be an absolute"), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_env_refuses_an_unusable_cache_dir_and_expands_home(freetoken_env: Any) -> None:
    from freetoken.config import env

    freetoken_env("FREETOKEN_CACHE", "")
    with pytest.raises(ValueError, match="FREETOKEN_CACHE must be an absolute"):
        env()
    freetoken_env("FREETOKEN_CACHE", "~/ftcache")
    assert env().cache_dir == os.path.join(os.path.expanduser("~"), "ftcache")
