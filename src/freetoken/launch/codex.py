"""OpenAI Codex CLI: a model provider in ``config.toml`` plus a ``freetoken`` profile file.

Files live in ``$CODEX_HOME`` (default ``~/.codex``):
- ``config.toml`` gains ``[model_providers.freetoken]`` (``base_url`` + ``wire_api =
  "responses"``: Codex speaks the Responses API). Nothing else in it changes.
- ``freetoken.config.toml`` is the profile: since Codex 0.134 ``--profile NAME`` layers
  ``$CODEX_HOME/NAME.config.toml`` over ``config.toml`` and no longer reads
  ``[profiles.NAME]``; a matching legacy ``[profiles.freetoken]`` table even makes Codex
  refuse to start, so an old one of ours is removed from ``config.toml``.
The profile pins the model, the provider and the context window (``model_context_window``
and the auto-compaction limit), since Codex has no metadata for a model it does not know.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from freetoken.launch import tomlw
from freetoken.launch.base import API_KEY_ENV, LaunchError, LaunchPlan, ServerInfo, home_dir
from freetoken.launch.files import FileChange, read_text

BINARY = "codex"
INSTALL_HINT = (
    "Codex CLI is not installed (no `codex` on PATH). Install it with\n"
    "  npm install -g @openai/codex\n"
    "then run this again."
)
PROVIDER = "freetoken"
PROFILE = "freetoken"
# Local prefill of a long context can take minutes before the first streamed byte.
STREAM_IDLE_TIMEOUT_MS = 600_000
# Text characters of its first request (instructions, input, 9 tool definitions): Codex 0.171.0.
FIRST_REQUEST_CHARS = 34_143
HEADER = "# Codex profile written by `ft launch codex` (used as `codex --profile freetoken`).\n"


def codex_home(env: Mapping[str, str]) -> Path:
    return Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else home_dir(env) / ".codex"


def provider_table(server: ServerInfo) -> dict[str, object]:
    return {
        "name": "FreeToken",
        "base_url": server.openai_base,
        "wire_api": "responses",
        "env_key": API_KEY_ENV,  # Codex sends $FREETOKEN_API_KEY as the bearer token (the plan sets it)
        "stream_idle_timeout_ms": STREAM_IDLE_TIMEOUT_MS,
    }


def profile_settings(server: ServerInfo) -> dict[str, object]:
    return {
        "model": server.model,
        "model_provider": PROVIDER,
        "model_context_window": server.context_length,
        # Compact at 90% of the window (Codex's own rule for models it knows).
        "model_auto_compact_token_limit": server.context_length * 9 // 10,
        # No output limit: Codex 0.171 ignores `model_max_output_tokens` (and warns about it on every run).
    }


def _config_change(path: Path, server: ServerInfo) -> FileChange:
    old = read_text(path)
    tables: dict[tuple[str, ...], Mapping[str, object] | None] = {
        ("model_providers", PROVIDER): provider_table(server),
    }
    if old is not None and PROFILE in tomlw.loads(old).get("profiles", {}):
        tables[("profiles", PROFILE)] = None
    return FileChange(path, old, tomlw.set_tables(old or "", tables))


def _profile_change(path: Path, server: ServerInfo) -> FileChange:
    old = read_text(path)
    current = tomlw.loads(old) if old is not None else {}
    new = HEADER + tomlw.dumps({**current, **profile_settings(server)})
    had_comments = old is not None and "#" in old.replace(HEADER, "")
    note = "rewritten whole; comments are not kept" if had_comments else ""
    return FileChange(path, old, new, note)


def plan(server: ServerInfo, env: Mapping[str, str], args: Sequence[str]) -> LaunchPlan:
    home = codex_home(env)
    files = []
    for path, make in (
        (home / "config.toml", _config_change),
        (home / f"{PROFILE}.config.toml", _profile_change),
    ):
        try:
            files.append(make(path, server))
        except tomlw.TOMLDecodeError as exc:
            raise LaunchError(f"cannot parse {path} ({exc}); fix it first") from exc
    return LaunchPlan(agent="codex", binary=BINARY, args=("--profile", PROFILE, *args), files=tuple(files),
                      env_set={API_KEY_ENV: server.api_key})  # fmt: skip
