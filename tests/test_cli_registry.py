"""The ``ft`` registries list only what exists: every subcommand and every benchmark module imports and offers
its entry points, and ``ft --help`` / ``ft bench --help`` show exactly those."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

from freetoken.cli.bench import BENCHMARKS
from freetoken.cli.main import HELP, SUBCOMMANDS, build_parser


def test_every_subcommand_and_benchmark_exists() -> None:
    for module in SUBCOMMANDS.values():
        mod = importlib.import_module(module)
        assert callable(mod.add_parser) and callable(mod.run), module
    for module in BENCHMARKS.values():
        mod = importlib.import_module(module)
        assert callable(mod.add_arguments) and callable(mod.run), module


def test_help_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS) and "quantize" not in out
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--help"])
    out = capsys.readouterr().out
    # agent-edits is one; no bare "agent" benchmark is listed (not built)
    assert all(name in out for name in BENCHMARKS) and re.search(r"^\s+agent\s", out, re.M) is None


def test_the_help_lines_are_the_modules_own() -> None:
    """``ft --help`` lists each subcommand from ``HELP`` without importing it: the same line its module gives."""
    full, light = build_parser(), build_parser(only="")
    full_sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    light_sub = next(a for a in light._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in full_sub._choices_actions}
    assert helps == HELP == {c.dest: c.help for c in light_sub._choices_actions}
