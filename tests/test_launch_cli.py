"""``ft launch``'s command line: a missing agent binary (its install hint; nothing configured), bad command lines,
and options after the agent's name."""

from __future__ import annotations

from typing import Any

import pytest

from launch_harness import all_files, ft_launch


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
