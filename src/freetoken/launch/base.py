"""What every ``ft launch <agent>`` shares: find the server and its model, describe the
launch as a plan (env vars + file changes + command), print it, apply it, run the agent.

Each agent module builds a :class:`LaunchPlan` from a :class:`ServerInfo`; nothing is
touched until :func:`apply_plan`, so ``--dry-run`` prints the very plan a real run applies.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from freetoken.launch.files import FileChange, apply_change

DEFAULT_SERVER = "http://127.0.0.1:1919"
DEFAULT_MODEL = "freetoken"
# Used only when the server cannot be asked. Hermes refuses windows under 64k.
DEFAULT_CONTEXT_LENGTH = 65536
# The key sent when none is given (--api-key, FREETOKEN_API_KEY): a server started without --api-key checks none, and
# this placeholder satisfies agents that insist on sending one.
API_KEY = "freetoken"
API_KEY_ENV = "FREETOKEN_API_KEY"


class LaunchError(Exception):
    """A launch that cannot go ahead (e.g. an agent config we cannot parse); nothing was written."""


@dataclass(frozen=True)
class ServerInfo:
    """The server an agent is pointed at. ``base_url`` has no trailing ``/v1``."""

    base_url: str
    model: str
    context_length: int
    max_output_tokens: int
    reachable: bool
    models: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    tool_calls: bool = True  # the server reads the model's tool calls
    reasoning: bool = False  # the model writes a reasoning block
    api_key: str = API_KEY  # what the agent sends (and ``ft launch`` sent to probe)

    @property
    def openai_base(self) -> str:
        """Base for OpenAI-style clients, which append ``/chat/completions`` etc."""
        return self.base_url + "/v1"


def normalize_server_url(url: str | None) -> str:
    url = (url or DEFAULT_SERVER).strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def default_output_tokens(context_length: int) -> int:
    """The output limit written for agents: an eighth of the window, within [256, 32k]. Agents compact
    once the conversation passes the window less this, so a large share makes them compact after every
    step (half the window did, in opencode)."""
    return max(256, min(32768, context_length // 8))


def api_key(given: str | None, env: Mapping[str, str]) -> str:
    """The key to send: ``--api-key``, else ``$FREETOKEN_API_KEY``, else the placeholder."""
    return given or env.get(API_KEY_ENV) or API_KEY


def fetch_models(base_url: str, timeout: float = 2.0, key: str = API_KEY) -> list[dict[str, object]]:
    """GET ``/v1/models``; raises ``OSError``/``ValueError`` when it cannot be read."""
    headers = {"Accept": "application/json", "Authorization": f"Bearer {key}"}
    req = urllib.request.Request(base_url + "/v1/models", headers=headers)
    with opener_for(base_url).open(req, timeout=timeout) as resp:
        body = json.loads(resp.read().decode("utf-8"))
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ValueError("/v1/models answered without a 'data' list")
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def opener_for(base_url: str) -> urllib.request.OpenerDirector:
    """A loopback server is asked directly, even when http_proxy is set for the outside world."""
    local = urllib.parse.urlsplit(base_url).hostname in ("127.0.0.1", "localhost", "::1")
    return urllib.request.build_opener(urllib.request.ProxyHandler({})) if local else urllib.request.build_opener()


def _int_field(entry: Mapping[str, object], *names: str) -> int | None:
    for name in names:
        v = entry.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def probe_server(url: str | None, model: str | None = None, timeout: float = 2.0, key: str = API_KEY) -> ServerInfo:
    """Ask the server for its models with ``key``; fall back to ``model``/defaults when it is down or refuses the
    key (``reachable`` False, the reason in ``warnings``)."""
    base = normalize_server_url(url)
    try:
        entries = fetch_models(base, timeout, key)
    except urllib.error.HTTPError as exc:
        why = f"it answered {exc.code} {exc.reason}"
        if exc.code in (401, 403):
            why += f": pass the server's key with --api-key or {API_KEY_ENV}"
        return _offline(base, model, why, key)
    except (OSError, ValueError) as exc:
        return _offline(base, model, str(getattr(exc, "reason", exc)), key)
    ids = tuple(str(e["id"]) for e in entries)
    warnings: list[str] = []
    chosen = next((e for e in entries if e["id"] == model), None)
    if model is not None and chosen is None:
        warnings.append(f"model {model!r} is not served by {base} (it serves: {', '.join(ids) or 'none'})")
    if chosen is None and model is None and entries:
        chosen = entries[0]
    reported = _int_field(chosen, "context_length", "max_model_len", "context_window") if chosen else None
    if reported is None:
        warnings.append(f"no context_length reported; assuming {DEFAULT_CONTEXT_LENGTH}")
    ctx = reported or DEFAULT_CONTEXT_LENGTH
    cap = _int_field(chosen, "max_output_tokens", "max_completion_tokens") if chosen else None
    name = model or (str(chosen["id"]) if chosen else DEFAULT_MODEL)
    out = min(cap, default_output_tokens(ctx)) if cap else default_output_tokens(ctx)
    caps = chosen.get("capabilities") if chosen else None
    caps = caps if isinstance(caps, dict) else {}
    return ServerInfo(
        base,
        name,
        ctx,
        out,
        reachable=True,
        models=ids,
        warnings=tuple(warnings),
        tool_calls=caps.get("tool_calls") is not False,
        reasoning=caps.get("reasoning") is True,
        api_key=key,
    )


def _offline(base: str, model: str | None, reason: str, key: str) -> ServerInfo:
    name, ctx = model or DEFAULT_MODEL, DEFAULT_CONTEXT_LENGTH
    warning = f"server {base} not reachable ({reason}); using model {name!r} and context length {ctx}"
    return ServerInfo(base, name, ctx, default_output_tokens(ctx), reachable=False, warnings=(warning,), api_key=key)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything ``ft launch`` will do for one agent, before it does any of it."""

    agent: str
    binary: str
    args: tuple[str, ...]
    env_set: Mapping[str, str] = field(default_factory=dict)
    env_unset: tuple[str, ...] = ()
    files: tuple[FileChange, ...] = ()
    notes: tuple[str, ...] = ()

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in self.env_unset}
        env.update(self.env_set)
        return env


class AgentModule(Protocol):
    """What each ``launch/<agent>.py`` module provides."""

    BINARY: str
    INSTALL_HINT: str
    FIRST_REQUEST_CHARS: int

    def plan(self, server: ServerInfo, env: Mapping[str, str], args: Sequence[str]) -> LaunchPlan: ...


def home_dir(env: Mapping[str, str]) -> Path:
    """The user's home as the agent will see it (``$HOME`` first, as the agents do)."""
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def render_plan(plan: LaunchPlan, server: ServerInfo) -> str:
    """Human-readable plan: server, env vars, file diffs, command line."""
    state = "up" if server.reachable else "not reachable"
    lines = [
        f"server: {server.base_url} ({state})",
        f"model: {server.model}  context: {server.context_length}  max output: {server.max_output_tokens}",
    ]
    lines += [f"warning: {w}" for w in server.warnings]
    if plan.env_set or plan.env_unset:
        lines.append("environment:")
        lines += [f"  unset {k}" for k in plan.env_unset]
        lines += [f"  {k}={_shell_quote(v)}" for k, v in plan.env_set.items()]
    for change in plan.files:
        if not change.changed:
            lines.append(f"file {change.path}: already up to date")
            continue
        verb = "create" if change.old_text is None else "update (backup first)"
        lines.append(f"file {change.path}: {verb}" + (f" [{change.note}]" if change.note else ""))
        lines.append(change.diff().rstrip("\n"))
    lines += [f"note: {n}" for n in plan.notes]
    lines.append("command: " + " ".join(_shell_quote(a) for a in (plan.binary, *plan.args)))
    return "\n".join(lines)


def _shell_quote(s: str) -> str:
    if s and all(c.isalnum() or c in "-_./:=@,+%" for c in s):
        return s
    return "'" + s.replace("'", "'\"'\"'") + "'"


def find_binary(name: str, env: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=env.get("PATH", os.defpath))


def apply_plan(plan: LaunchPlan) -> list[tuple[Path, Path | None]]:
    """Write every changed file (backing each up first); returns (file, backup) pairs."""
    return [(c.path, apply_change(c)) for c in plan.files if c.changed]


def exec_agent(path: str, plan: LaunchPlan, env: Mapping[str, str]) -> None:
    """Replace this process with the agent (terminal and signals go straight to it)."""
    os.execve(path, [plan.binary, *plan.args], plan.child_env(env))
