"""The engine's flags on the subcommands that load a model: every ``EngineConfig`` field, generated
(``config.add_config_args``), with ``--moe-backend`` taking every backend registered in this process and saying where
a placement that left the engine went (``ft serve`` registers none; ``ft bench http`` starts one that does)."""

from __future__ import annotations

import argparse
from collections.abc import Collection
from typing import Any

from freetoken.config import FLAGS, MOE_BACKENDS, EngineConfig, Flag, add_config_args
from freetoken.experts.backends.registry import backend_names

# the peers' placements left the engine for the benchmarks (``bench/placements/``): where to find them
MOVED_BACKENDS = {
    name: f"{name} is a benchmark placement now: ft bench decode --policies {name}"
    for name in ("static-layers", "static-freq")
}


class MoEBackendAction(argparse.Action):
    """The backends registered in this process; a placement that moved to the benchmarks (not registered here) ends
    the command with one line saying where."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        if values in MOVED_BACKENDS and values not in backend_names():
            parser.exit(2, f"{parser.prog}: error: {MOVED_BACKENDS[values]}\n")
        if values not in backend_names():
            choose = ", ".join(backend_names())
            parser.error(f"argument {option_string}: invalid choice: {values!r} (choose from {choose})")
        setattr(namespace, self.dest, values)


CLI_FLAGS = FLAGS | {"moe_backend": Flag(metavar="{" + ",".join(MOE_BACKENDS) + "}", action=MoEBackendAction)}


def add_engine_args(p: argparse.ArgumentParser, skip: Collection[str] = ()) -> None:
    """A flag for every ``EngineConfig`` field but ``skip`` (``config_from_args(EngineConfig, args)`` reads them)."""
    add_config_args(p, EngineConfig, skip=skip, flags=CLI_FLAGS)
