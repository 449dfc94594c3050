"""``ft launch <agent>``: point a coding agent at a running FreeToken server.

One module per agent (lazy imports); each exposes ``BINARY``, ``INSTALL_HINT`` and
``plan(server, env, args) -> LaunchPlan`` (see ``base.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from freetoken.launch.base import AgentModule

AGENTS: dict[str, str] = {
    "claude": "freetoken.launch.claude",
    "codex": "freetoken.launch.codex",
    "opencode": "freetoken.launch.opencode",
    "openclaw": "freetoken.launch.openclaw",
    "hermes": "freetoken.launch.hermes",
}


def load_agent(name: str) -> AgentModule:
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; choose one of {', '.join(AGENTS)}")
    return cast("AgentModule", importlib.import_module(AGENTS[name]))
