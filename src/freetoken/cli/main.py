"""The ``ft`` command: a thin dispatcher over one module per subcommand.

Each subcommand module exposes ``add_parser(subparsers) -> argparse.ArgumentParser`` and
``run(args) -> int``. Modules are imported lazily, so ``ft --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from freetoken.config import env

# name -> module (each one exists: tests/test_cli_registry.py).
SUBCOMMANDS: dict[str, str] = {
    "serve": "freetoken.cli.serve",
    "chat": "freetoken.cli.chat",
    "generate": "freetoken.cli.generate",
    "bench": "freetoken.cli.bench",
    "launch": "freetoken.cli.launch",
    "ctl": "freetoken.cli.ctl",
    "convert": "freetoken.cli.convert",
    "models": "freetoken.cli.models",
}


def build_parser() -> argparse.ArgumentParser:
    from freetoken import __version__

    parser = argparse.ArgumentParser(prog="ft", description="FreeToken: serve MoE LLMs on one machine.")
    parser.add_argument("--version", action="version", version=f"ft (FreeToken) {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        mod = importlib.import_module(module)
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        env()  # a variable FreeToken cannot use is refused before any work
    except ValueError as e:
        print(f"ft: error: {e}", file=sys.stderr)
        return 1
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
