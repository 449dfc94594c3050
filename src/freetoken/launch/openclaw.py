"""OpenClaw: a ``models.providers.freetoken`` entry in its JSON5 config, set as the default.

The config is ``$OPENCLAW_CONFIG_PATH``, else ``$OPENCLAW_STATE_DIR/openclaw.json``, else
``~/.openclaw/openclaw.json``. OpenClaw validates it strictly (unknown keys stop the
gateway), so only documented keys are written: the provider (``api:
"openai-completions"`` against ``/v1``, with ``contextWindow``/``maxTokens`` per model),
``models.mode: "merge"`` (keep the built-in providers) and the default model
``agents.defaults.model.primary``. If the user keeps a model allow-list
(``agents.defaults.models``) our model is added to it. The file is written back as
plain JSON (valid JSON5); comments do not survive, the backup keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from freetoken.launch.base import LaunchError, LaunchPlan, ServerInfo, home_dir
from freetoken.launch.files import FileChange, deep_merge, loads_json5, read_text

BINARY = "openclaw"
INSTALL_HINT = (
    "OpenClaw is not installed (no `openclaw` on PATH). Install it with\n"
    "  npm install -g openclaw\n"
    "then run `openclaw onboard` once and run this again."
)
PROVIDER = "freetoken"
# Its first request is 29,187 tokens of the default model's tokenizer (OpenClaw 2026.9.6, tests/clients/), given
# here in characters at opencode's measured ratio (27,440 characters for 13,781 tokens).
FIRST_REQUEST_CHARS = 58_115


def config_path(env: Mapping[str, str]) -> Path:
    if env.get("OPENCLAW_CONFIG_PATH"):
        return Path(env["OPENCLAW_CONFIG_PATH"])
    if env.get("OPENCLAW_STATE_DIR"):
        return Path(env["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    return home_dir(env) / ".openclaw" / "openclaw.json"


def provider_entry(server: ServerInfo) -> dict[str, Any]:
    return {
        "baseUrl": server.openai_base,
        "apiKey": server.api_key,  # OpenClaw wants a key even for servers that check none
        "api": "openai-completions",
        "models": [
            {
                "id": server.model,
                "name": f"{server.model} (FreeToken)",
                "reasoning": server.reasoning,
                "input": ["text"],
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                "contextWindow": server.context_length,
                "maxTokens": server.max_output_tokens,
            }
        ],
    }


def updated_config(current: Mapping[str, Any], server: ServerInfo) -> dict[str, Any]:
    ref = f"{PROVIDER}/{server.model}"
    cfg = deep_merge(current, {"models": {"mode": current.get("models", {}).get("mode", "merge")}})
    cfg["models"]["providers"] = {**cfg["models"].get("providers", {}), PROVIDER: provider_entry(server)}
    defaults = cfg.setdefault("agents", {}).setdefault("defaults", {})
    model = defaults.get("model")
    defaults["model"] = {**model, "primary": ref} if isinstance(model, dict) else {"primary": ref}
    if isinstance(defaults.get("models"), dict) and ref not in defaults["models"]:
        defaults["models"] = {**defaults["models"], ref: {}}
    return cfg


def plan(server: ServerInfo, env: Mapping[str, str], args: Sequence[str]) -> LaunchPlan:
    path = config_path(env)
    old = read_text(path)
    try:
        current = loads_json5(old) if old and old.strip() else {}
    except ValueError as exc:
        raise LaunchError(f"cannot parse {path} ({exc}); fix it or run `openclaw doctor`") from exc
    if not isinstance(current, dict):
        raise LaunchError(f"{path} does not hold a JSON object")
    new = json.dumps(updated_config(current, server), indent=2, ensure_ascii=False) + "\n"
    note = "written as plain JSON; comments are not kept" if old and ("//" in old or "/*" in old) else ""
    return LaunchPlan(
        agent="openclaw",
        binary=BINARY,
        args=tuple(args) or ("tui",),
        files=(FileChange(path, old, new, note),),
        notes=("a running OpenClaw gateway reads the new provider after `openclaw gateway restart`",),
    )
