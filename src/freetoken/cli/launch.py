"""``ft launch AGENT [--dry-run] [--force] [--no-server-check] [--server URL] [--model NAME] [--api-key KEY]
[-- AGENT ARGS]``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from freetoken.launch import AGENTS, fit, load_agent
from freetoken.launch.base import (
    API_KEY_ENV,
    DEFAULT_CONTEXT_LENGTH,
    DEFAULT_SERVER,
    LaunchError,
    api_key,
    apply_plan,
    exec_agent,
    find_binary,
    probe_server,
    render_plan,
)

# Exit status when the agent's binary is missing, as a shell reports "command not found".
EXIT_NOT_FOUND = 127


def _add_options(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    default = argparse.SUPPRESS if suppress else None
    p.add_argument(
        "--dry-run",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="print the env vars and file diffs that would be applied; change nothing",
    )
    p.add_argument(
        "--server", default=default, metavar="URL", help=f"FreeToken server (default {DEFAULT_SERVER})"
    )
    p.add_argument(
        "--model",
        default=default,
        metavar="NAME",
        help="model id (default: the server's first model; 'freetoken' when it is down)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="launch even when the agent's first request does not fit the model's context",
    )
    p.add_argument("--api-key", default=default, metavar="KEY",
                   help=f"the server's --api-key, sent by ft launch and written for the agent (default: "
                   f"${API_KEY_ENV}, else a placeholder for a server that checks none)")  # fmt: skip
    p.add_argument("--no-server-check", action="store_true", default=argparse.SUPPRESS if suppress else False,
                   help="start the agent even when the server does not answer (with the model name, context "
                   f"length {DEFAULT_CONTEXT_LENGTH} and output limit it then assumes)")  # fmt: skip


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "launch",
        usage="ft launch [-h] [--dry-run] [--force] [--no-server-check] [--server URL] [--model NAME] [--api-key KEY] "
        "AGENT [-- AGENT_ARGS ...]",
        help="point a coding agent at the FreeToken server and start it",
        description="Configure a coding agent for the FreeToken server (env vars and config files, "
        "each changed file backed up first) and start it. Arguments after `--` go to the agent. "
        f"AGENT is one of: {', '.join(AGENTS)}.",
    )
    _add_options(p)
    # The agent name and everything after it, verbatim. One REMAINDER positional keeps a
    # `--` right after the agent name on every Python version (a separate `agent`
    # positional would let argparse swallow it, turning `-- --dry-run` into ours).
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="AGENT", help=argparse.SUPPRESS)
    return p


def _split_argv(args: argparse.Namespace) -> tuple[str, list[str]]:
    """Agent name and the agent's own arguments; our options after the name are parsed here."""
    argv = list(args.argv)
    if not argv or argv[0] not in AGENTS:
        got = f"unknown agent {argv[0]!r}" if argv else "no agent given"
        raise LaunchError(f"{got}; choose one of {', '.join(AGENTS)}")
    rest = argv[1:]
    ours, theirs = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    late = argparse.ArgumentParser(prog="ft launch", add_help=False)
    _add_options(late, suppress=True)
    parsed, unknown = late.parse_known_args(ours)
    if unknown:
        raise LaunchError(f"unknown option(s) {' '.join(unknown)}; put the agent's own arguments after `--`")
    for k, v in vars(parsed).items():
        setattr(args, k, v)
    return argv[0], theirs


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    try:
        name, agent_args = _split_argv(args)
        agent = load_agent(name)
        server = probe_server(args.server, args.model, key=api_key(args.api_key, env))
        verdict = None
        if server.reachable:
            verdict = fit.check(name, agent.FIRST_REQUEST_CHARS, server, fit.chars_per_token(server))
            server = dataclasses.replace(server, max_output_tokens=verdict.output_tokens)
        plan = agent.plan(server, env, agent_args)
    except LaunchError as exc:
        print(f"ft launch: {exc}", file=sys.stderr)
        return 2
    print(render_plan(plan, server))
    if verdict is not None:
        print(f"first request: about {verdict.first_request_tokens} tokens of {server.context_length}"
              + ("" if verdict.fits else " (does not fit)"))  # fmt: skip
    if args.dry_run:
        if verdict is not None and not verdict.fits:
            print(f"warning: {verdict.message}")
        print("dry run: nothing was changed")
        return 0
    if verdict is not None and not verdict.fits and not args.force:
        print(f"ft launch: {verdict.message}", file=sys.stderr)
        return 1
    path = find_binary(plan.binary, env)
    if path is None:
        print(f"ft launch: {agent.INSTALL_HINT}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if not server.reachable and not args.no_server_check:  # an agent started blind hangs on its first request
        print(f"ft launch: {server.warnings[0]}; start `ft serve` first (or pass --no-server-check to start "
              f"{name} with these assumptions); nothing was changed", file=sys.stderr)  # fmt: skip
        return 1
    for changed, backup in apply_plan(plan):
        print(f"wrote {changed}" + (f" (backup: {backup})" if backup else ""))
    sys.stdout.flush()
    exec_agent(path, plan, env)
    return 0  # not reached: exec replaced this process
