"""`ft` start-up as a user meets it: each bad setting or unloadable model is one clear line and a non-zero
exit, `ft serve` opens its port only once the model is loaded, and logs one line per request."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import tomllib

from server_harness import free_port, tiny_checkpoint
from subproc import child_env

ROOT = Path(__file__).resolve().parent.parent


def ft(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = child_env()
    return subprocess.run([sys.executable, "-m", "freetoken.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)  # fmt: skip


def one_error_line(r: subprocess.CompletedProcess[str], command: str) -> str:
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ft {command}: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_version() -> None:
    from freetoken import __version__

    r = ft("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"ft (FreeToken) {__version__}"


HELP_ONLY = """
import contextlib, io, sys
from freetoken.cli.main import main
for argv in (["--help"], ["--version"], []):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
print(sorted(m for m in ("torch", "transformers", "triton", "numpy") if m in sys.modules))
"""


def test_help_and_version_import_no_torch() -> None:
    """``ft --help``, ``ft --version`` and a bare ``ft`` list the subcommands without importing torch (seconds on a
    laptop); a subcommand's own ``--help`` imports what its flags need."""
    r = subprocess.run([sys.executable, "-c", HELP_ONLY], capture_output=True, text=True, timeout=60,
                       env=child_env())  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    out = ft("--help").stdout
    assert all(f"    {name}" in out for name in ("serve", "chat", "generate", "bench", "launch", "models"))


@pytest.mark.parametrize(
    "args,says",
    [
        (["--port", "99999"], "port must be in 1..65535, got 99999"),
        (["--port", "0"], "port must be in 1..65535"),
        (["--model", "/nonexistent"], "cannot load /nonexistent: /nonexistent: model directory does not exist"),
        (["--max-model-len", "99999"], "--max-model-len 99999 is more than this model's context"),
        (["--max-model-len", "1"], "max_model_len must be at least 2"),
        (["--responses-store", "-1"], "responses_store must be >= 0"),
        (["--cpu-threads", "0"], "cpu_threads must be >= 1 (omit it for the physical cores - 1), got 0"),
    ],
)
def test_serve_refuses_with_one_line(args: list[str], says: str) -> None:
    port = ["--port", str(free_port())] if "--port" not in args else []
    line = one_error_line(ft("serve", "--device", "cpu", *port, *args), "serve")
    assert says in line, line


def test_serve_refuses_a_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        start = time.monotonic()
        line = one_error_line(ft("serve", "--port", str(port)), "serve")
        assert f"cannot listen on 127.0.0.1:{port}" in line
        assert time.monotonic() - start < 60  # refused before loading anything


def test_ctl_needs_nothing_beyond_the_runtime_set() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("httpx") for d in deps) and any(d.startswith("llguidance") for d in deps)


def test_serve_binds_only_once_loaded_and_logs_each_request(tmp_path: Path) -> None:
    model = tiny_checkpoint(str(tmp_path / "tiny"))
    port = free_port()
    env = child_env()
    cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--model", model, "--port", str(port), "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), ln) for ln in proc.stdout or []))
    reader.start()
    try:
        first_open = None
        deadline = time.monotonic() + 120
        while first_open is None and time.monotonic() < deadline and proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    first_open = time.monotonic()
            time.sleep(0.02)
        assert first_open is not None, lines
        loaded = [t for t, ln in list(lines) if ln.startswith("FreeToken: loaded")]
        assert loaded and loaded[0] <= first_open, lines  # the port opened after the model loaded
        text = "".join(ln for _, ln in list(lines))
        assert "memory plan (host RAM" in text and "expert slots" in text and "KV pages" in text, lines  # the table
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200
        time.sleep(0.5)
        assert any('"GET /v1/models HTTP/1.1" 200' in ln for _, ln in list(lines)), lines  # uvicorn's access log
    finally:
        proc.terminate()
        proc.wait(30)
        reader.join(10)
    assert proc.returncode == 0
