"""``ft launch`` against a live server: what it probes (model, context, output limit, capabilities; a server that
is down), and whether the agent's first request fits the context served (refused at once, unless ``--force``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from freetoken.launch import load_agent
from freetoken.launch.base import DEFAULT_CONTEXT_LENGTH, default_output_tokens, probe_server
from launch_harness import CHARS_PER_TOKEN, all_files, fake_agent, ft_launch, recorded

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
