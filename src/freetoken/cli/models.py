"""``ft models``: the models in the Hugging Face cache (where ``ft serve --model ORG/NAME`` downloads to), with their
size, family, weight format and whether this engine serves them."""

from __future__ import annotations

import argparse
from typing import Any

from freetoken.cli.common import run_guarded


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser("models", help="list the downloaded models (the Hugging Face cache)",
                                                description=__doc__)  # fmt: skip
    return p


def run(args: argparse.Namespace) -> int:
    return run_guarded("models", _models)


def _models() -> int:
    from rich.console import Console
    from rich.table import Table

    from freetoken.loader.hub_cache import cache_dir, cached_models

    console = Console()
    if not console.is_terminal:  # piped: whole rows, one a line, for grep
        console = Console(width=240)
    models = cached_models()
    if not models:
        console.print(f"no models in {cache_dir()}; ft serve --model ORG/NAME downloads one", highlight=False)
        return 0
    table = Table(title=f"models in {cache_dir()}", title_justify="left")
    for col in ("model", "revision", "size", "family", "format", "served"):
        table.add_column(col, justify="right" if col == "size" else "left", overflow="fold")
    for m in models:
        s = m.support
        table.add_row(m.repo_id, m.revision, _size(m.size_bytes), s.architecture, s.format, "yes" if s.served else "no")
    console.print(table, highlight=False)
    for m in models:  # why not, one line each under the table
        if not m.support.served:
            console.print(f"{m.repo_id} ({m.revision}): {m.support.reason}", highlight=False, markup=False)
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
