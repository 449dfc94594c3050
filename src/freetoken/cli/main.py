"""The ``ft`` command: a thin dispatcher over one module per subcommand.

Each subcommand module exposes ``add_parser(subparsers) -> argparse.ArgumentParser`` and
``run(args) -> int``. Only the chosen subcommand's module is imported: ``ft --help`` and ``ft --version`` list the
others from ``HELP`` and never import torch.
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
# each subcommand's one line in ``ft --help``, the same as its module's (tests/test_cli_registry.py)
HELP: dict[str, str] = {
    "serve": "serve a model over the OpenAI and Anthropic APIs",
    "chat": "chat in the terminal",
    "generate": "complete a prompt",
    "bench": "benchmarks: bandwidth profile, decode, prefill, routing traces",
    "launch": "point a coding agent at the FreeToken server and start it",
    "ctl": "query a running server",
    "convert": "convert a checkpoint to FTW (fast start)",
    "models": "list the downloaded models (the Hugging Face cache)",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser (``only`` None), or ``only``'s alone with the others as their help line ("": none:
    what ``ft --help`` needs)."""
    from freetoken import __version__

    parser = argparse.ArgumentParser(prog="ft", description="FreeToken: serve MoE LLMs on one machine.")
    parser.add_argument("--version", action="version", version=f"ft (FreeToken) {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=HELP[name], add_help=False)
            continue
        mod = importlib.import_module(module)
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=given[0] if given and given[0] in SUBCOMMANDS else "")
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
