"""``ft launch``'s test harness: the models a fake server serves (``ModelsHandler``; conftest.py's ``server``
fixture runs it on loopback), fake agent binaries (small Python scripts that record their argv and environment)
and the launcher run in a child process with PATH holding only those fakes (conftest.py's ``box``), so the real
exec path runs and no real agent is ever started."""

from __future__ import annotations

import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

MODELS = {
    "object": "list",
    "data": [
        {"id": "qwen3-moe", "object": "model", "context_length": 131072, "max_output_tokens": 8192},
        {"id": "small", "object": "model", "context_length": 32768},
        {"id": "tiny", "object": "model", "context_length": 2048,
         "capabilities": {"tool_calls": False, "reasoning": True}},
    ],
}
CHARS_PER_TOKEN = 4  # what the fake server's count_tokens counts
# Runs only the launch subcommand (the full `ft` dispatcher imports every subcommand).
LAUNCH_ONLY = (
    "import argparse, sys\n"
    "from freetoken.cli import launch\n"
    "p = argparse.ArgumentParser(prog='ft'); s = p.add_subparsers()\n"
    "launch.add_parser(s)\n"
    "sys.exit(launch.run(p.parse_args(sys.argv[1:])))\n"
)
RECORDER = (
    "import json, os, sys\n"
    "json.dump({'argv': sys.argv, 'env': dict(os.environ)}, open(os.environ['FT_RECORD'], 'w'))\n"
)



class ModelsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps(MODELS).encode() if self.path == "/v1/models" else b"{}"
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        data = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        ok = self.path == "/v1/messages/count_tokens"
        text = "".join(m["content"] for m in data.get("messages", [])) if ok else ""
        body = json.dumps({"input_tokens": len(text) // CHARS_PER_TOKEN}).encode()
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def fake_agent(box: dict[str, Any], name: str) -> None:
    path = box["bin"] / name
    path.write_text(f"#!{sys.executable}\n{RECORDER}")
    path.chmod(0o755)


def ft_launch(
    box: dict[str, Any], *args: str, extra_env: dict[str, str] | None = None, full_cli: bool = False
) -> subprocess.CompletedProcess[str]:
    entry = ["-m", "freetoken.cli"] if full_cli else ["-c", LAUNCH_ONLY]
    return subprocess.run(
        [sys.executable, *entry, "launch", *args],
        env={**box["env"], **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def recorded(box: dict[str, Any]) -> dict[str, Any]:
    return json.loads(box["record"].read_text())


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".*.bak"))


# A Codex config.toml with settings of its own, and our legacy profile table (read by the TOML and codex tests).
CODEX_CONFIG = """\
# my codex settings
model = "gpt-5"  # keep me
approval_policy = "on-request"

[model_providers.other]
name = "Other"
base_url = "https://other.example/v1"

[profiles.freetoken]  # legacy table: current Codex rejects it next to freetoken.config.toml
model = "old"

[profiles.freetoken.features]
x = true

# docs server (this comment belongs to the next table)
[mcp_servers.docs]
command = "docs-mcp"
args = ["--port", "9"]
"""
