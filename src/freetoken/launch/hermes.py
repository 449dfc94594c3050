"""Hermes Agent (Nous Research): the ``model:`` section of ``~/.hermes/config.yaml``.

``$HERMES_HOME`` (default ``~/.hermes``) holds ``config.yaml``. The ``model:`` section
becomes a custom endpoint (``provider: custom``, ``base_url`` ending in ``/v1``,
``default`` model) with an explicit ``context_length``: Hermes refuses windows under 64k
that it cannot confirm, and the explicit value wins over its own detection. The server
is also added to ``custom_providers`` (named ``freetoken``) so ``/model
custom:freetoken:<model>`` works from inside a session. Other sections are left as they
are; YAML comments do not survive the rewrite (the backup keeps them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from freetoken.launch.base import LaunchError, LaunchPlan, ServerInfo, home_dir
from freetoken.launch.files import FileChange, read_text

BINARY = "hermes"
INSTALL_HINT = (
    "Hermes Agent is not installed (no `hermes` on PATH). Install it with\n"
    "  curl -fsSL \\\n"
    "    https://raw.githubusercontent.com/NousResearch/hermes-agent/main/scripts/install.sh | bash\n"
    "then run this again."
)
PROVIDER = "freetoken"
# Its first request is 24,739 tokens of the default model's tokenizer (Hermes Agent 0.19.0, tests/clients/), given
# here in characters at opencode's measured ratio (27,440 characters for 13,781 tokens).
FIRST_REQUEST_CHARS = 49_258
# Keys of the old `model:` section that belong to the previous provider and would
# mislead Hermes about ours (`model` is an alias of `default`).
STALE_MODEL_KEYS = ("model", "api_key", "api_mode", "key_env")


def hermes_home(env: Mapping[str, str]) -> Path:
    return Path(env["HERMES_HOME"]) if env.get("HERMES_HOME") else home_dir(env) / ".hermes"


def updated_config(current: Mapping[str, Any], server: ServerInfo) -> dict[str, Any]:
    cfg = dict(current)
    old_model = cfg.get("model")
    kept = {}
    if isinstance(old_model, dict):
        kept = {k: v for k, v in old_model.items() if k not in STALE_MODEL_KEYS}
    cfg["model"] = {
        **kept,
        "default": server.model,
        "provider": "custom",
        "base_url": server.openai_base,
        "context_length": server.context_length,
        "api_key": server.api_key,  # Hermes' credential for a custom model (``model_config``)
    }
    entry = {
        "name": PROVIDER,
        "base_url": server.openai_base,
        "api_mode": "chat_completions",
        "api_key": server.api_key,
        "models": {server.model: {"context_length": server.context_length}},
    }
    providers = cfg.get("custom_providers")
    others = (
        [p for p in providers if not (isinstance(p, dict) and p.get("name") == PROVIDER)]
        if isinstance(providers, list)
        else []
    )
    cfg["custom_providers"] = [*others, entry]
    return cfg


def plan(server: ServerInfo, env: Mapping[str, str], args: Sequence[str]) -> LaunchPlan:
    path = hermes_home(env) / "config.yaml"
    old = read_text(path)
    try:
        current = yaml.safe_load(old) if old else None
    except yaml.YAMLError as exc:
        raise LaunchError(f"cannot parse {path}: {exc}") from exc
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise LaunchError(f"{path} does not hold a YAML mapping")
    new = yaml.safe_dump(updated_config(current, server), sort_keys=False, allow_unicode=True)
    note = "rewritten by PyYAML; comments are not kept" if old and "#" in old else ""
    return LaunchPlan(
        agent="hermes",
        binary=BINARY,
        args=tuple(args),
        files=(FileChange(path, old, new, note),),
    )
