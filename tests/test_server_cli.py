"""``ft serve`` as a real process (Ctrl-C exits cleanly) and ``ft ctl`` against a running server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest

from freetoken.cli.main import main
from freetoken.config import EngineConfig, field_docs
from freetoken.config import expert_cache_arg as cache_size
from scripted_engine import ScriptedEngine, build_tokenizer
from server_harness import MODEL, free_port, serve, tiny_checkpoint
from subproc import child_env


def test_ctl_talks_to_a_server(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with serve(ScriptedEngine(build_tokenizer(str(tmp_path)))) as srv:
        assert main(["ctl", "health", "--server", srv.url]) == 0
        assert json.loads(capsys.readouterr().out)["status"] == "ok"
        assert main(["ctl", "models", "--server", srv.url]) == 0
        assert json.loads(capsys.readouterr().out)["data"][0]["id"] == MODEL
        assert main(["ctl", "stats", "--server", srv.url]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "ready"
    assert main(["ctl", "health", "--server", f"http://127.0.0.1:{free_port()}", "--timeout", "2"]) == 2


def test_serve_flags() -> None:
    assert cache_size("64") == 64 and cache_size("0.25") == 0.25
    assert field_docs(EngineConfig)["expert_cache"].startswith("Expert-slot cache size")


def test_ft_serve_process_answers_and_exits_on_ctrl_c(tmp_path: Any) -> None:
    model = tiny_checkpoint(str(tmp_path / "tiny"))
    port = free_port()
    env = child_env()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "freetoken.cli",
            "serve",
            "--model",
            model,
            "--port",
            str(port),
            "--device",
            "cpu",
            "--served-model-name",
            MODEL,
            "--api-key",
            "k1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        banner = [proc.stdout.readline(), proc.stdout.readline()]
        assert f"http://127.0.0.1:{port}" in banner[0], banner
        curl = banner[1].strip()
        assert curl.startswith("curl ") and "Authorization: Bearer k1" in curl
        # The printed curl line is a working request.
        body = json.loads(curl.split(" -d ")[1].strip("'"))
        assert body["max_tokens"] == 64
        body["max_tokens"] = 4  # keep the test short
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body,
            headers={"Authorization": "Bearer k1"},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
        assert httpx.get(f"http://127.0.0.1:{port}/health").json()["status"] == "ok"
        # Ctrl-C while a stream is running: the process still exits cleanly.
        with httpx.stream(
            "POST",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=60,
            headers={"Authorization": "Bearer k1"},
            json={**body, "stream": True, "max_tokens": 24},
        ) as s:
            lines = s.iter_lines()
            next(lines)
            proc.send_signal(signal.SIGINT)
            rest = [ln for ln in lines if ln]
        assert rest[-1] == "data: [DONE]"  # the running request was finished, not cut
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")
