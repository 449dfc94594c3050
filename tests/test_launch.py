"""`ft launch` per agent: dry runs that print the plan and change nothing, and real runs into a temporary HOME:
each agent's environment and config files, backups, merges that keep unrelated settings, unparsable configs
refused untouched, second launches that change nothing, and symlinked configs written through.

End-to-end cases run the launcher in a child process with PATH holding only fake agent
binaries (small Python scripts that record their argv and environment), so the real
exec path runs and no real agent is ever started (``launch_harness.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from freetoken.launch import load_agent
from freetoken.launch.base import apply_plan, probe_server
from launch_harness import CODEX_CONFIG, all_files, backups, fake_agent, ft_launch, recorded

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
