"""`ft launch`: server probing over real HTTP, per-agent dry runs and real writes into a
temporary HOME, backups, merges that keep unrelated settings, and missing binaries.

End-to-end cases run the launcher in a child process with PATH holding only fake agent
binaries (small Python scripts that record their argv and environment), so the real
exec path runs and no real agent is ever started.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from freetoken.launch import load_agent, tomlw
from freetoken.launch.base import (
    DEFAULT_CONTEXT_LENGTH,
    apply_plan,
    default_output_tokens,
    probe_server,
)
from freetoken.launch.files import loads_json5

SRC = Path(__file__).resolve().parents[1] / "src"
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


class _Models(BaseHTTPRequestHandler):
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


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


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


# ---------------------------------------------------------------------------- server


def test_probe_reads_model_and_context_from_live_server(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # a loopback server is never proxied
    info = probe_server(server + "/v1/")  # a trailing /v1 is accepted and dropped
    assert info.reachable and info.base_url == server
    assert (info.model, info.context_length, info.max_output_tokens) == ("qwen3-moe", 131072, 8192)
    assert info.models == ("qwen3-moe", "small", "tiny") and info.openai_base == server + "/v1"
    assert info.tool_calls and not info.reasoning  # no capabilities reported: tool calls assumed
    tiny = probe_server(server, "tiny")
    assert not tiny.tool_calls and tiny.reasoning
    small = probe_server(server, "small")
    assert (small.context_length, small.max_output_tokens) == (32768, default_output_tokens(32768))
    missing = probe_server(server, "nope")
    assert missing.model == "nope" and missing.context_length == DEFAULT_CONTEXT_LENGTH
    assert any("not served" in w for w in missing.warnings)


def test_probe_falls_back_when_server_is_down(dead_url: str) -> None:
    info = probe_server(dead_url, "my-model", timeout=0.5)
    assert not info.reachable and info.model == "my-model"
    assert info.context_length == DEFAULT_CONTEXT_LENGTH >= 65536  # Hermes' floor
    assert "not reachable" in info.warnings[0]


# ---------------------------------------------------------------------------- TOML

_scalar = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _value, max_size=5))
@example({"0\n": {}})  # found by Hypothesis: a key ending in a newline passed for a bare key
@example({"0\n": []})
@example({"a\n": 1, "b": {"c\n": "x"}})
def test_toml_dumps_round_trips(doc: dict[str, Any]) -> None:
    assert tomllib.loads(tomlw.dumps(doc)) == doc


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


def test_set_tables_replaces_only_our_tables_and_keeps_comments() -> None:
    table = {"name": "FreeToken", "base_url": "http://h/v1"}
    out = tomlw.set_tables(
        CODEX_CONFIG, {("model_providers", "freetoken"): table, ("profiles", "freetoken"): None}
    )
    doc = tomllib.loads(out)
    assert doc["model_providers"] == {
        "other": {"name": "Other", "base_url": "https://other.example/v1"},
        "freetoken": table,
    }
    assert "profiles" not in doc or "freetoken" not in doc["profiles"]
    assert doc["mcp_servers"] == {"docs": {"command": "docs-mcp", "args": ["--port", "9"]}}
    for kept in ("# my codex settings", 'model = "gpt-5"  # keep me', "# docs server", "[mcp_servers.docs]"):
        assert kept in out
    assert tomlw.set_tables(out, {("model_providers", "freetoken"): table}) == out  # idempotent


def test_set_tables_rewrites_layouts_it_cannot_edit_and_refuses_broken_files() -> None:
    dotted = 'model_providers.freetoken.base_url = "stale"\nmodel = "m"\n'
    out = tomlw.set_tables(dotted, {("model_providers", "freetoken"): {"base_url": "new"}})
    assert tomllib.loads(out) == {"model": "m", "model_providers": {"freetoken": {"base_url": "new"}}}
    with pytest.raises(tomllib.TOMLDecodeError):
        tomlw.set_tables("model = ", {("a",): {"b": 1}})


def test_json5_subset() -> None:
    text = """{
      // comment, with "quotes" and a trailing comma inside: ,}
      gateway: { port: 18789, },
      'single': 'it\\'s "x"',
      /* block */ "url": "http://a//b",
      list: [1, 2,],
    }"""
    assert loads_json5(text) == {
        "gateway": {"port": 18789},
        "single": 'it\'s "x"',
        "url": "http://a//b",
        "list": [1, 2],
    }


# ---------------------------------------------------------------------------- dry run

DRY_RUN_EXPECT = {
    "claude": [
        "ANTHROPIC_BASE_URL={url}",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL=qwen3-moe",
        "CLAUDE_CODE_SUBAGENT_MODEL=qwen3-moe",
        "CLAUDE_CODE_ATTRIBUTION_HEADER=0",
        "unset ANTHROPIC_API_KEY",
        "command: claude --resume",
    ],
    "codex": [
        "+[model_providers.freetoken]",
        '+base_url = "{url}/v1"',
        '+wire_api = "responses"',
        "+model_context_window = 131072",
        "command: codex --profile freetoken --resume",
    ],
    "opencode": [
        "OPENCODE_CONFIG_CONTENT=",
        "@ai-sdk/openai-compatible",
        '"context":131072',
        "command: opencode --resume",
    ],
    "openclaw": [
        '"api": "openai-completions"',
        '"contextWindow": 131072',
        '"primary": "freetoken/qwen3-moe"',
        "command: openclaw --resume",
    ],
    "hermes": [
        "+  provider: custom",
        "+  base_url: {url}/v1",
        "+  context_length: 131072",
        "command: hermes --resume",
    ],
}


@pytest.mark.parametrize("agent", list(DRY_RUN_EXPECT))
def test_dry_run_prints_plan_and_changes_nothing(agent: str, server: str, box: dict[str, Any]) -> None:
    fake_agent(box, agent)
    res = ft_launch(box, agent, "--dry-run", "--server", server, "--", "--resume")
    assert res.returncode == 0, res.stderr
    for line in DRY_RUN_EXPECT[agent]:
        assert line.format(url=server) in res.stdout
    assert "nothing was changed" in res.stdout
    assert all_files(box["home"]) == [] and not box["record"].exists()


def test_dry_run_shows_diff_of_existing_file_through_ft(server: str, box: dict[str, Any]) -> None:
    cfg = box["home"] / ".hermes" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text("model:\n  default: old\n  provider: openrouter\n")
    res = ft_launch(box, "hermes", "--server", server, "--dry-run", full_cli=True)
    assert res.returncode == 0, res.stderr
    assert "-  default: old" in res.stdout and "+  default: qwen3-moe" in res.stdout
    assert cfg.read_text() == "model:\n  default: old\n  provider: openrouter\n" and backups(cfg) == []


# ---------------------------------------------------------------------------- real runs


def test_claude_env(server: str, box: dict[str, Any]) -> None:
    fake_agent(box, "claude")
    # `--dry-run` after `--` belongs to the agent: this is a real launch.
    args = ("claude", "--server", server, "--", "--dry-run", "-p", "hi")
    res = ft_launch(box, *args, extra_env={"ANTHROPIC_API_KEY": "sk-real"})
    assert res.returncode == 0, res.stderr
    rec = recorded(box)
    assert rec["argv"][1:] == ["--dry-run", "-p", "hi"]
    env = rec["env"]
    assert env["ANTHROPIC_BASE_URL"] == server and env["ANTHROPIC_AUTH_TOKEN"]
    assert "ANTHROPIC_API_KEY" not in env  # the user's real key never reaches the local server
    for var in (
        "ANTHROPIC_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    ):
        assert env[var] == "qwen3-moe"
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "131072"
    assert all_files(box["home"]) == []


def test_codex_writes_provider_and_profile(server: str, box: dict[str, Any], tmp_path: Path) -> None:
    fake_agent(box, "codex")
    codex_home = tmp_path / "codexhome"  # $CODEX_HOME wins over ~/.codex
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(CODEX_CONFIG)
    res = ft_launch(
        box, "codex", "--server", server, "--model", "small", extra_env={"CODEX_HOME": str(codex_home)}
    )
    assert res.returncode == 0, res.stderr
    assert recorded(box)["argv"][1:] == ["--profile", "freetoken"]
    cfg = tomllib.loads((codex_home / "config.toml").read_text())
    assert cfg["model_providers"]["freetoken"]["base_url"] == server + "/v1"
    assert cfg["model_providers"]["freetoken"]["wire_api"] == "responses"
    assert cfg["model"] == "gpt-5" and cfg["approval_policy"] == "on-request"  # unrelated settings kept
    assert (
        cfg["model_providers"]["other"]["name"] == "Other"
        and cfg["mcp_servers"]["docs"]["command"] == "docs-mcp"
    )
    assert "freetoken" not in cfg.get("profiles", {})
    assert "# my codex settings" in (codex_home / "config.toml").read_text()
    profile = tomllib.loads((codex_home / "freetoken.config.toml").read_text())
    assert profile == {
        "model": "small",
        "model_provider": "freetoken",
        "model_context_window": 32768,
        "model_auto_compact_token_limit": 32768 * 9 // 10,
    }
    (bak,) = backups(codex_home / "config.toml")
    assert bak.read_text() == CODEX_CONFIG
    assert not (box["home"] / ".codex").exists()


def test_opencode_env_merges_inline_config(server: str, box: dict[str, Any]) -> None:
    fake_agent(box, "opencode")
    res = ft_launch(
        box, "opencode", "--server", server, extra_env={"OPENCODE_CONFIG_CONTENT": '{"theme": "tokyo"}'}
    )
    assert res.returncode == 0, res.stderr
    cfg = json.loads(recorded(box)["env"]["OPENCODE_CONFIG_CONTENT"])
    prov = cfg["provider"]["freetoken"]
    assert prov["npm"] == "@ai-sdk/openai-compatible" and prov["options"]["baseURL"] == server + "/v1"
    assert prov["models"]["qwen3-moe"]["limit"] == {"context": 131072, "output": 8192}
    assert cfg["model"] == "freetoken/qwen3-moe" and cfg["theme"] == "tokyo"
    assert all_files(box["home"]) == []


OPENCLAW_JSON5 = """{
  // my gateway
  gateway: { port: 18789, },
  models: { providers: { ollama: { baseUrl: "http://127.0.0.1:11434", api: "ollama", models: [], }, }, },
  agents: { defaults: {
    model: { primary: "anthropic/claude-x", fallbacks: ["openai/y"] },
    models: { "anthropic/claude-x": { alias: "x" } },
  } },
}
"""


def test_openclaw_merges_provider_into_json5(server: str, box: dict[str, Any]) -> None:
    fake_agent(box, "openclaw")
    path = box["home"] / ".openclaw" / "openclaw.json"
    path.parent.mkdir()
    path.write_text(OPENCLAW_JSON5)
    res = ft_launch(box, "openclaw", "--server", server)
    assert res.returncode == 0, res.stderr
    assert recorded(box)["argv"][1:] == ["tui"]
    cfg = json.loads(path.read_text())
    prov = cfg["models"]["providers"]["freetoken"]
    assert prov["baseUrl"] == server + "/v1" and prov["api"] == "openai-completions"
    assert prov["models"][0]["id"] == "qwen3-moe" and prov["models"][0]["contextWindow"] == 131072
    assert prov["models"][0]["maxTokens"] == 8192
    assert cfg["models"]["providers"]["ollama"]["api"] == "ollama" and cfg["gateway"] == {"port": 18789}
    model = cfg["agents"]["defaults"]["model"]
    assert model == {"primary": "freetoken/qwen3-moe", "fallbacks": ["openai/y"]}
    assert set(cfg["agents"]["defaults"]["models"]) == {"anthropic/claude-x", "freetoken/qwen3-moe"}
    (bak,) = backups(path)
    assert bak.read_text() == OPENCLAW_JSON5


@pytest.mark.parametrize(
    "agent,relpath,text",
    [
        ("openclaw", ".openclaw/openclaw.json", "{ broken: "),
        ("codex", ".codex/config.toml", "model = "),
        ("hermes", ".hermes/config.yaml", "model: [unclosed"),
    ],
)
def test_unparsable_config_is_refused_untouched(
    agent: str, relpath: str, text: str, server: str, box: dict[str, Any]
) -> None:
    fake_agent(box, agent)
    path = box["home"] / relpath
    path.parent.mkdir()
    path.write_text(text)
    res = ft_launch(box, agent, "--server", server)
    assert res.returncode == 2 and "cannot parse" in res.stderr and "Traceback" not in res.stderr
    assert path.read_text() == text and backups(path) == [] and not box["record"].exists()


HERMES_YAML = """\
# hermes settings
model:
  default: anthropic/claude-opus
  provider: openrouter
  api_key: sk-or-secret
  max_tokens: 4096
terminal:
  backend: docker
custom_providers:
- name: local
  base_url: http://localhost:8080/v1
- name: freetoken
  base_url: http://stale:1/v1
"""


def test_hermes_writes_model_section(server: str, box: dict[str, Any]) -> None:
    fake_agent(box, "hermes")
    path = box["home"] / ".hermes" / "config.yaml"
    path.parent.mkdir()
    path.write_text(HERMES_YAML)
    res = ft_launch(box, "hermes", "--server", server, "--", "chat")
    assert res.returncode == 0, res.stderr
    assert recorded(box)["argv"][1:] == ["chat"]
    cfg = yaml.safe_load(path.read_text())
    assert cfg["model"] == {
        "max_tokens": 4096,
        "default": "qwen3-moe",
        "provider": "custom",
        "base_url": server + "/v1",
        "context_length": 131072,
        "api_key": "freetoken",  # ours (the placeholder: no --api-key), not the stale one for another provider
    }
    assert cfg["terminal"] == {"backend": "docker"}
    names = [p["name"] for p in cfg["custom_providers"]]
    assert names == ["local", "freetoken"] and cfg["custom_providers"][1]["base_url"] == server + "/v1"
    (bak,) = backups(path)
    assert bak.read_text() == HERMES_YAML


@pytest.mark.parametrize("agent", ["codex", "openclaw", "hermes"])
def test_second_launch_changes_nothing(agent: str, server: str, box: dict[str, Any]) -> None:
    env = box["env"]
    info = probe_server(server)
    first = load_agent(agent).plan(info, env, [])
    assert first.files and all(c.old_text is None for c in first.files)
    written = apply_plan(first)
    assert [backup for _, backup in written] == [None] * len(first.files)  # new files: nothing to back up
    second = load_agent(agent).plan(info, env, [])
    assert not any(c.changed for c in second.files) and apply_plan(second) == []
    assert not any(p.name.endswith(".bak") for p in all_files(box["home"]))


@pytest.mark.parametrize(
    "agent,hint",
    [
        ("claude", "npm install -g @anthropic-ai/claude-code"),
        ("codex", "npm install -g @openai/codex"),
        ("opencode", "npm install -g opencode-ai"),
        ("openclaw", "npm install -g openclaw"),
        ("hermes", "hermes-agent"),
    ],
)
def test_missing_binary_prints_install_hint(
    agent: str, hint: str, dead_url: str, box: dict[str, Any]
) -> None:
    res = ft_launch(box, agent, "--server", dead_url)
    assert res.returncode == 127
    assert hint in res.stderr and "Traceback" not in res.stderr
    assert all_files(box["home"]) == []  # nothing is configured for an agent that is not there


def test_bad_command_lines_are_errors(box: dict[str, Any], dead_url: str) -> None:
    res = ft_launch(box, "claude", "--server", dead_url, "--resume")
    assert res.returncode == 2 and "after `--`" in res.stderr
    for argv in ([], ["vim"]):
        res = ft_launch(box, *argv)
        assert (
            res.returncode == 2
            and "choose one of claude, codex" in res.stderr
            and "Traceback" not in res.stderr
        )


def test_options_after_agent_name(box: dict[str, Any], dead_url: str) -> None:
    res = ft_launch(box, "codex", "--dry-run", "--server", dead_url, "--model", "m1")
    assert res.returncode == 0 and '+model = "m1"' in res.stdout and "not reachable" in res.stdout
    assert all_files(box["home"]) == []


def test_symlinked_config_is_written_through(server: str, box: dict[str, Any], tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "hermes.yaml"
    real.parent.mkdir()
    real.write_text("terminal:\n  backend: local\n")
    link = box["home"] / ".hermes" / "config.yaml"
    link.parent.mkdir()
    link.symlink_to(real)
    plan = load_agent("hermes").plan(probe_server(server), box["env"], [])
    assert [c.path for c in plan.files] == [link]
    ((_, backup),) = apply_plan(plan)
    assert link.is_symlink() and yaml.safe_load(real.read_text())["model"]["provider"] == "custom"
    assert backup is not None and backup.read_text() == "terminal:\n  backend: local\n"


# ---------------------------------------------------------------------------- does it fit


def test_output_limit_leaves_the_agent_room() -> None:
    assert default_output_tokens(131072) == 16384 and default_output_tokens(2048) == 256
    assert default_output_tokens(10**7) == 32768


@pytest.mark.parametrize("agent", ["opencode", "codex", "claude"])
def test_a_context_too_small_for_the_first_request_is_refused_at_once(
    agent: str, server: str, box: dict[str, Any]
) -> None:
    fake_agent(box, agent)
    first = load_agent(agent).FIRST_REQUEST_CHARS // CHARS_PER_TOKEN
    res = ft_launch(box, agent, "--server", server, "--model", "tiny", "--", "run", "hi")
    assert res.returncode == 1 and not box["record"].exists()  # the agent never started
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("ft launch:")]
    assert "has a context of 2048 tokens" in line and "--force" in line
    estimate = int(line.split("about ")[1].split(" tokens")[0])
    assert first <= estimate <= first * 1.2  # counted with the server's tokenizer, plus a margin
    assert all_files(box["home"]) == []
    dry = ft_launch(box, agent, "--dry-run", "--server", server, "--model", "tiny")
    assert dry.returncode == 0 and "(does not fit)" in dry.stdout and "warning: " in dry.stdout
    forced = ft_launch(box, agent, "--force", "--server", server, "--model", "tiny", "--", "x")
    assert forced.returncode == 0 and recorded(box)["argv"][1:][-1] == "x"


def test_opencode_limits_follow_the_server(server: str, box: dict[str, Any]) -> None:
    fake_agent(box, "opencode")
    assert ft_launch(box, "opencode", "--server", server, "--model", "small").returncode == 0
    cfg = json.loads(recorded(box)["env"]["OPENCODE_CONFIG_CONTENT"])
    model = cfg["provider"]["freetoken"]["models"]["small"]
    assert model["limit"] == {"context": 32768, "output": 32768 // 8}
    assert model["tool_call"] is True and model["reasoning"] is False
