"""``ft launch`` against a server that checks a key, and against none: the key (``--api-key``, else
``$FREETOKEN_API_KEY``) goes with ``ft launch``'s own requests and into every agent's configuration; a server that
refuses the key, or does not answer, stops the launch with one line before anything is written or started
(``--no-server-check`` starts the agent anyway). A real HTTP server on loopback; fake agent binaries record what
they were started with (``launch_harness.py``; conftest.py's box)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from launch_harness import MODELS, all_files, fake_agent, ft_launch, recorded

KEY = "s3cret-key"
SEEN: list[tuple[str, str]] = []  # (path, Authorization) of every request the keyed server got


class _Keyed(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization", "")
        SEEN.append((self.path, auth))
        if auth != f"Bearer {KEY}":
            self._answer(401, {"error": {"message": "Invalid API key", "type": "authentication_error"}})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self._authorized():
            self._answer(200, MODELS)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self._authorized():
            self._answer(200, {"input_tokens": 200})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def keyed() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Keyed)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _written(home: Path) -> str:
    return "\n".join(p.read_text() for p in all_files(home) if not p.name.endswith(".bak"))


@pytest.mark.parametrize("agent", ["claude", "codex", "opencode", "openclaw", "hermes"])
@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_key_reaches_the_server_and_the_agent(agent: str, how: str, keyed: str, box: dict[str, Any]) -> None:
    fake_agent(box, agent)
    SEEN.clear()
    args, env = (["--api-key", KEY], {}) if how == "flag" else ([], {"FREETOKEN_API_KEY": KEY})
    res = ft_launch(box, agent, "--server", keyed, *args, extra_env=env)
    assert res.returncode == 0, res.stderr
    assert SEEN and all(auth == f"Bearer {KEY}" for _, auth in SEEN)  # /v1/models and count_tokens
    assert "(up)" in res.stdout and "count_tokens" in " ".join(p for p, _ in SEEN)
    child = recorded(box)["env"]
    if agent == "claude":
        assert child["ANTHROPIC_AUTH_TOKEN"] == KEY
    elif agent == "codex":  # Codex reads the bearer token from the variable its provider names
        assert child["FREETOKEN_API_KEY"] == KEY
        config = tomllib.loads((box["home"] / ".codex" / "config.toml").read_text())
        assert config["model_providers"]["freetoken"]["env_key"] == "FREETOKEN_API_KEY"
    elif agent == "hermes":
        cfg = yaml.safe_load((box["home"] / ".hermes" / "config.yaml").read_text())
        assert cfg["model"]["api_key"] == KEY and cfg["custom_providers"][-1]["api_key"] == KEY
    elif agent == "opencode":  # its configuration travels inline, in the environment
        provider = json.loads(child["OPENCODE_CONFIG_CONTENT"])["provider"]["freetoken"]
        assert provider["options"]["apiKey"] == KEY
    else:
        assert KEY in _written(box["home"])


def test_a_refused_key_stops_the_launch(keyed: str, box: dict[str, Any]) -> None:
    fake_agent(box, "claude")
    res = ft_launch(box, "claude", "--server", keyed, "--api-key", "wrong")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "401" in res.stderr and "--api-key or FREETOKEN_API_KEY" in res.stderr
    assert not box["record"].exists() and all_files(box["home"]) == []  # not started, nothing written


@pytest.mark.parametrize("agent", ["claude", "codex", "opencode", "openclaw", "hermes"])
def test_no_server_stops_the_launch_quickly(agent: str, dead_url: str, box: dict[str, Any]) -> None:
    fake_agent(box, agent)
    t0 = time.monotonic()
    res = ft_launch(box, agent, "--server", dead_url)
    assert time.monotonic() - t0 < 5 and res.returncode == 1
    assert "not reachable" in res.stderr and "ft serve" in res.stderr and "--no-server-check" in res.stderr
    assert not box["record"].exists() and all_files(box["home"]) == []


def test_no_server_check_starts_the_agent_with_what_it_assumed(dead_url: str, box: dict[str, Any]) -> None:
    fake_agent(box, "claude")
    res = ft_launch(box, "claude", "--server", dead_url, "--no-server-check", "--model", "m1")
    assert res.returncode == 0, res.stderr
    assert "not reachable" in res.stdout and "context: 65536" in res.stdout
    assert recorded(box)["env"]["ANTHROPIC_MODEL"] == "m1"
